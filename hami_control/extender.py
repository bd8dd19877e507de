"""kube-scheduler extender v1 `/filter` and `/prioritize`: request JSON in, response JSON out. Pure.

The wire types are `k8s.io/kube-scheduler/extender/v1`, which have no json tags, so the keys are the Go
field names (k8s.io/kube-scheduler/extender/v1 `types.go`):

- `ExtenderArgs{Pod, Nodes, NodeNames}`: `Nodes` is a full NodeList (`{"items": [Node, ...]}`) and
  `NodeNames` a list of names (`nodeCacheCapable: true`); kube-scheduler sends one of them.
- `ExtenderFilterResult{Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}`; the answer
  uses the form of the question (a NodeList of the fitting Node objects, or their names), the other is
  null.
- `HostPriorityList`: `[{"Host": name, "Score": 0..10}]`.

Filter (`filter_pod`):
- A pod that names no HAMi resource, or asks for no GPU count (`nvidia.com/gpu` absent or 0 in every
  container), passes through: every candidate is returned, none fails.
- Otherwise every candidate the pod fits on is returned (HAMi returns only its best one, #2264; here
  kube-scheduler's own plugins and Prioritize choose among them). With `--fragmentation-filter best`, a
  pod under the fragmentation node policy gets only the fitting nodes where the fragmentation, with
  each node's free CPU in the measure, grows least (`HostCPU`, `_least_fragmenting`; closer to HAMi's
  one-node answer, pkg/scheduler/scheduler.go `Filter`, but equal nodes are all kept for kube-scheduler
  to choose among); the other fitting nodes fail with `not the least fragmenting node`. With
  `--fragmentation-filter one` it is the one node of FGD's best score, and the other fitting nodes are
  left out of the answer, in neither NodeNames nor FailedNodes (counted as `NotLeastFragmenting` in the
  filter-reason metric), as for `/cpu-filter` (`cpu_filter_nodes`). kube-scheduler accepts such an
  answer: `HTTPExtender.Filter` (pkg/scheduler/extender.go) only checks that each name of NodeNames was
  sent, and `findNodesThatPassExtenders` (pkg/scheduler/schedule_one.go) turns FailedNodes into node
  statuses, which only a pod left with no feasible node shows (its FitError, the FailedScheduling
  event's "0/N nodes are available") or preemption reads. With one node kept the pod has a feasible
  node, so a user loses nothing; the answer loses ~80 bytes a node (405 KB at 5,000 nodes, ~3 ms to
  build, send and parse: bench/cpu_extender.py).
- A node that does not fit gets a reason in `FailedNodes` (the service writes them only for a pod that
  fits no candidate unless `--filter-failed-nodes always`: `config.FailedNodes`), HAMi's text (its
  `GenReason`): per reason,
  `<GPUs that failed for it>/<GPUs of the node> <Reason>`, sorted as text (Go's sort.Strings, so "10/16"
  sorts before "2/16") and joined by ", ", e.g. `"3/8 CardInsufficientMemory, 5/8 CardTypeMismatch"`;
  GPUs that passed on a node short of them count as `AllocatedCardsInsufficientRequest`, and a node
  with fewer GPUs than a container asks gets `NodeInsufficientDevice` alone. The counts are those of the
  first container (init containers first) that does not fit; the vocabulary is `fit.Reason`.
- A node the view does not know gets `node unregistered: <why>` (the view's reason, or "not in the
  scheduler's cache").
- Nodes that no eviction can make fit go to `FailedAndUnresolvableNodes` instead of `FailedNodes`, so
  kube-scheduler's preemption skips them: too few GPUs in total or too few of the asked
  type/mode/UUID (`FitFailure.unresolvable`), and unregistered nodes. A node is in at most one map.
- Bad input (a body that is not an object, no `Pod`, neither `Nodes` nor `NodeNames`, a pod resource or
  annotation that does not parse) comes back in `Error`, a message naming the field and the value; the
  functions here never raise on input.

Prioritize (`prioritize_pod`): one entry per candidate (first occurrence of each name), score 0..10 by the
node policy (`hami.io/node-scheduler-policy` on the pod unless empty, else the config's), from
`score.node_priority` over the node with the pod's chosen slices placed at their peak (`fragmentation`:
how little the node's fragmentation for the task mix in use grows, `score.fragmentation_score`,
computed node by node from fit_pod's GPU choice). A node the pod
does not fit on (or that is unregistered) scores 0. A pod without a GPU request, or one whose request
cannot be read, scores 0 everywhere: the same for all nodes, so kube-scheduler's other scores decide
(kube-scheduler ignores an extender's failed prioritize anyway). Unreadable candidates give `[]`.

Cost: the pod (requests, annotations, policies, quota limits) is read once per request (`read_pod_ask`);
the service (`scheduling.Extender`) reads it once per scheduling cycle instead and calls `filter_nodes` /
`prioritize_nodes` with the ask, passing a `NodeFit` that reuses the cycle's GPU choices. With a
`gputable.GPUTable` (the service passes one), a pod with one GPU-asking container is answered for every
candidate at once by numpy over the table (~1 ms for 5,000 nodes x 8 GPUs), with the same verdicts, texts
and scores as `fit_pod`; other pods (several GPU containers, numa-bind, a quota the pod only partly fits
under) cost one `fit_pod` per candidate, O(GPUs of the node x log), ~100 µs a node.

Fast paths of the service (issue 29), each with a property test that it answers what the plain
computation answers: the table's per-node answers for an ask are kept from one request to the next
(`gputable.RowCache`: verdicts, reason texts, scores, the fragmentation filter's per-node values) and
only the nodes changed since are computed again, so a filter or prioritize over 5,000 nodes is a few
array lookups once the ask was seen; the candidates are read from the body's `NodeNames` JSON once per
distinct list (`CandidateLists`, kept by its bytes: kube-scheduler sends the same nodes pod after pod);
answers are written from per-node JSON fragments (`FilterAnswer.as_json`, `PrioritizeAnswer.as_json`:
thousands of failed nodes grouped by their text, one join each) rather than built as objects and
encoded.

The GPU policy (`hami.io/gpu-scheduler-policy`), scoring weights (`hami.io/device-scoring-weights`) and
device selector annotations (`nvidia.com/use-gputype`, ...) of the pod are honoured as in `fit`. An empty
policy annotation (node or GPU) falls back to the configured default, as in HAMi; an unknown value is a
clear error.

Quota: `filter_pod(..., quota=view)` checks the namespace's GPU quota per GPU like HAMi's Fit
(`config.enforce_quota` switches it off). `QuotaView.used(namespace)` must not count the pod being
filtered (it is counted once it is bound).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import orjson

from hami_api.annotations import (
    DEVICE_SCORING_WEIGHTS,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
    NOUSE_GPU_TYPE,
    NOUSE_GPU_UUID,
    NUMA_BIND,
    USE_GPU_TYPE,
    USE_GPU_UUID,
    VGPU_MODE,
    decode_device_selector,
    decode_gpu_policy,
    decode_node_policy,
    decode_scoring_weights,
)
from hami_api.containers import ContainerKind, container_kind, footprint_slices, kinds_of
from hami_api.errors import QuantityError, RequestError, WireFormatError
from hami_api.resources import ContainerRequest, container_request, pod_containers, pod_has_hami_resource
from hami_api.types import (
    ContainerAllocation,
    DeviceSelector,
    GPUPolicy,
    NodePolicy,
    PodAllocation,
    ScoringWeights,
)
from hami_control.config import ControlConfig
from hami_control.devices.base import DevicePods, DeviceRequest, FitContext, QuotaEntry, Vendor
from hami_control.devices.podfit import VendorFit, VendorUnfit, fit_vendor_pod, too_few
from hami_control.devices.standard import NODE_INSUFFICIENT_DEVICE
from hami_control.fit import (
    DEFAULT_WEIGHTS,
    NO_SELECTOR,
    Fit,
    FitFailure,
    FitResult,
    QuotaCheck,
    Reason,
    fit_pod,
)
from hami_control.frag import DEFAULT_MIX, NO_PLACEMENT, TaskMix, cpu_only_scores_at, first_best
from hami_control.gputable import (
    BoolArray,
    Evaluation,
    FloatArray,
    GPUTable,
    IntArray,
    ReasonTexts,
    RowCache,
    SimpleAsk,
    evaluate,
    fragmentation_best_scores,
    fragmentation_growth,
    fragmentation_scores,
    free_milli_rows,
    free_total_rows,
    group_rows,
    node_scores,
    score_inputs,
    simple_ask,
)
from hami_control.quota import QuotaLimits, QuotaUsage, QuotaView
from hami_control.score import MAX_SCORE, node_priority, node_usage
from hami_control.usage import NodeGPUs

log = logging.getLogger(__name__)

UNREGISTERED = "node unregistered"
"""Prefix of the FailedNodes reason of a node the view does not know (HAMi's wording)."""
NOT_CACHED = "not in the scheduler's cache"
"""The `<why>` of an unknown node when the view gives no reason."""
NEUTRAL_SCORE = 0
"""Prioritize score of every node for a pod without a GPU request (or an unreadable one)."""


class NodeView(Protocol):
    """What the extender reads about nodes (implemented by the cluster cache)."""

    def node_gpus(self, name: str) -> NodeGPUs | None:
        """The node's GPUs and their current usage, or None when the node is not registered."""
        ...

    def unregistered_reason(self, name: str) -> str | None:
        """Why `name` is not registered (annotation does not decode, no handshake, ...), if known."""
        ...

    def vendor_devices(self, name: str) -> NodeGPUs | None:
        """The node's devices of the other vendors and their usage, or None when it has none."""
        ...

    def vendor_node(self, name: str) -> Mapping[str, Any]:
        """The node's name, labels and annotations, for the vendors' ScoreNode."""
        ...

    def vendor_problems(self, name: str) -> tuple[str, ...]:
        """Why vendors' devices of the node are left out (`<family>: <why>`), empty when none is."""
        ...

    def device_pods(self, name: str) -> DevicePods:
        """The pods holding each of the node's other-vendor devices (`cache.ClusterCache.device_pods`)."""
        ...

    @property
    def expectations(self) -> Mapping[str, str]:
        """The vendors' expectations of their devices after recent placements (`ClusterCache`)."""
        ...


class ExtenderArgsError(ValueError):
    """ExtenderArgs that cannot be used; the message names the field and the value."""


# --- reading the arguments --------------------------------------------------------------------------------


_MAX_SHOWN = 80


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # JSON nested past the recursion limit; an int past 4,300 digits
        return f"<{_kind(value)} nested too deep or too long to show>"
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


@dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes kube-scheduler asks about, in its order. `node_list` is the NodeList when the request
    carried full Node objects (`items[i]` is the object of `names[i]`), None for the names-only form."""

    names: tuple[str, ...]
    node_list: Mapping[str, Any] | None = None
    items: tuple[Any, ...] = ()
    names_json: bytes | None = field(default=None, compare=False, repr=False)
    """The names as the request wrote them (a JSON array), when it is known (`split_args`)."""
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """What is computed once per candidate list (kube-scheduler may send the same list pod after pod)."""

    def rows(self, table: GPUTable) -> tuple[IntArray, IntArray]:
        """(the table row of each candidate, -1 for a node the table does not have; the positions of the
        candidates it has), kept until a node gains or loses a row (read-only)."""
        kept = self._memo.get("rows")
        if kept is not None and kept[0] is table and kept[1] == table.layout:
            return kept[2], kept[3]
        rows = table.rows(self.names)
        known = np.flatnonzero(rows >= 0)
        known.flags.writeable = False
        self._memo["rows"] = (table, table.layout, rows, known)
        return rows, known

    def unique(self, table: GPUTable) -> bool:
        """Whether no name is given twice (kube-scheduler never repeats one)."""
        kept = self._memo.get("unique")
        if kept is None:
            rows, known = self.rows(table)
            if len(known) == len(rows):
                kept = len(known) == 0 or int(np.bincount(rows).max()) == 1
            else:
                kept = len(set(self.names)) == len(self.names)
            self._memo["unique"] = kept
        return bool(kept)

    def name_json(self, table: GPUTable, positions: IntArray) -> list[bytes]:
        """The names at `positions` as JSON strings."""
        rows, _ = self.rows(table)
        at = rows[positions]
        if len(at) and int(at.min()) < 0:
            return [orjson.dumps(self.names[p]) for p in positions.tolist()]
        written: list[bytes] = table.name_json[at].tolist()
        return written


def _args(args: object) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise ExtenderArgsError(f"ExtenderArgs: expected a JSON object, got {_kind(args)}")
    return args


def read_candidates(args: object) -> Candidates:
    """The candidate nodes of ExtenderArgs (`NodeNames` when given, else `Nodes.items[].metadata.name`).

    Raises `ExtenderArgsError`."""
    body = _args(args)
    names = body.get("NodeNames")
    if names is not None:
        if not isinstance(names, list):
            raise ExtenderArgsError(
                f"ExtenderArgs.NodeNames: expected a list of node names, got {_kind(names)}"
            )
        if set(map(type, names)) - {str} or "" in names:  # the common case checked at C speed
            for i, name in enumerate(names):
                if not isinstance(name, str) or not name:
                    raise ExtenderArgsError(
                        f"ExtenderArgs.NodeNames[{i}]: expected a node name, got {_shown(name)}"
                    )
        return Candidates(tuple(names))
    node_list = body.get("Nodes")
    if node_list is None:
        raise ExtenderArgsError("ExtenderArgs: neither Nodes nor NodeNames is given")
    if not isinstance(node_list, Mapping):
        raise ExtenderArgsError(f"ExtenderArgs.Nodes: expected a NodeList object, got {_kind(node_list)}")
    items = node_list.get("items")
    items = [] if items is None else items
    if not isinstance(items, list):
        raise ExtenderArgsError(f"ExtenderArgs.Nodes.items: expected a list of Nodes, got {_kind(items)}")
    out: list[str] = []
    for i, item in enumerate(items):
        where = f"ExtenderArgs.Nodes.items[{i}]"
        if not isinstance(item, Mapping):
            raise ExtenderArgsError(f"{where}: expected a Node object, got {_kind(item)}")
        metadata = item.get("metadata")
        if not isinstance(metadata, Mapping):
            raise ExtenderArgsError(f"{where}.metadata: expected an object, got {_kind(metadata)}")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ExtenderArgsError(f"{where}.metadata.name: expected a node name, got {_shown(name)}")
        out.append(name)
    return Candidates(tuple(out), node_list, tuple(items))


_NAMES_KEY = b',"NodeNames":['
"""Where kube-scheduler's ExtenderArgs name the candidates: its last field (Go writes a struct's fields in
their order, `Pod`, `Nodes`, `NodeNames`, k8s.io/kube-scheduler/extender/v1 types.go), so the list
runs to the body's closing brace."""


class CandidateLists:
    """ExtenderArgs read with the candidates of the last `size` distinct lists kept by the JSON of their
    names: kube-scheduler sends the same nodes pod after pod (every node with percentageOfNodesToScore
    100, and to /prioritize the nodes that fit), and such a list is then neither decoded nor checked
    again, nor are its table rows looked up again (`Candidates.rows`). Only the rest of the body is
    decoded. A body of another shape (or one that does not decode so) is decoded whole, as before.
    Not thread-safe (the event loop's)."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._kept: list[Candidates] = []
        """Most recently used first."""

    def read(self, body: bytes) -> tuple[Any, Candidates | None]:
        """(the decoded ExtenderArgs, its candidates when they were read here, else None: the caller reads
        them with `read_candidates`, which names what is wrong). The args then lack nothing the caller
        reads but `NodeNames`. Raises `orjson.JSONDecodeError` for a body that is not JSON."""
        at = body.rfind(_NAMES_KEY)
        if at > 0 and body.endswith(b"]}"):
            names_json = body[at + len(_NAMES_KEY) - 1 : -1]
            try:
                args = orjson.loads(body[:at] + b"}")
            except orjson.JSONDecodeError:
                args = None
            if isinstance(args, dict):
                candidates = self._find(names_json)
                if candidates is not None:
                    return args, candidates
                try:
                    names = orjson.loads(names_json)
                except orjson.JSONDecodeError:
                    names = None
                if isinstance(names, list):
                    try:
                        read = read_candidates({"NodeNames": names})
                    except ExtenderArgsError:
                        return orjson.loads(body), None  # the caller says what is wrong
                    candidates = Candidates(read.names, names_json=names_json)
                    self.remember(candidates)
                    return args, candidates
        return orjson.loads(body), None

    def remember(self, candidates: Candidates) -> None:
        """Keep `candidates` (with `names_json`) for a later request naming them: the nodes a filter
        answered, which kube-scheduler sends to /prioritize next."""
        if candidates.names_json is None:
            return
        kept = self._kept
        for i, known in enumerate(kept):
            if known is candidates:
                if i:
                    kept.insert(0, kept.pop(i))
                return
        kept.insert(0, candidates)
        del kept[self.size :]

    def _find(self, names_json: bytes) -> Candidates | None:
        kept = self._kept
        for i, candidates in enumerate(kept):
            known = candidates.names_json
            if known is not None and len(known) == len(names_json) and known == names_json:
                if i:
                    kept.insert(0, kept.pop(i))
                return candidates
        return None


@dataclass(frozen=True, slots=True)
class NamespaceQuota:
    """The namespace quota a pod is fitted under: its limits and what the namespace uses besides the pod.
    Called with the pod's usage so far, it says whether the namespace can take it, as
    `quota.check_quota` decides: only the dimensions the pod asks for count, and used + asked may reach
    the limit exactly. A value, so two checks compare equal exactly when they decide alike (the
    per-cycle state reuses a GPU choice only under an equal check)."""

    limits: QuotaLimits
    used: QuotaUsage

    def __call__(self, usage: QuotaUsage) -> bool:
        limits, used = self.limits, self.used
        if limits.memory is not None and usage.memory > 0 and used.memory + usage.memory > limits.memory:
            return False
        return limits.cores is None or usage.cores <= 0 or used.cores + usage.cores <= limits.cores


@dataclass(frozen=True, slots=True)
class VendorAsk:
    """What the pod asks of the vendors besides NVIDIA (`hami_control.devices`): per container (init
    containers first) the requests by common word, and what the vendors' Fit and PatchAnnotations read
    of the pod (its annotations and container names)."""

    requests: tuple[tuple[tuple[str, DeviceRequest], ...], ...]
    annotations: tuple[tuple[str, str], ...]
    containers: tuple[tuple[str, bool], ...]
    """(name, is init container) per container."""
    vendors: tuple[Vendor, ...] = field(default=(), compare=False)
    """The registry's vendors the requests name (not compared: the same config gives the same ones)."""
    _memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    """What `pod` and `fit` build once per ask (read-only once built)."""

    @property
    def by_container(self) -> tuple[dict[str, DeviceRequest], ...]:
        return tuple(dict(container) for container in self.requests)

    @property
    def by_container_memo(self) -> tuple[dict[str, DeviceRequest], ...]:
        """`by_container`, built once (read-only)."""
        requests: tuple[dict[str, DeviceRequest], ...] | None = self._memo.get("requests")
        if requests is None:
            requests = self._memo["requests"] = self.by_container
        return requests

    @property
    def uses_device_pods(self) -> bool:
        """Whether a vendor it asks reads the pods on each device (`Vendor.uses_device_pods`)."""
        return any(v.uses_device_pods for v in self.vendors)

    @property
    def inits(self) -> int:
        return sum(1 for _, init in self.containers if init)

    @property
    def words(self) -> tuple[str, ...]:
        """The common words the pod asks, in registry order."""
        asked = {word for container in self.requests for word, _ in container}
        return tuple(v.names.common_word for v in self.vendors if v.names.common_word in asked)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A pod object with what the vendors read (metadata and container names); built once."""
        key = ("pod", namespace, name)
        built: dict[str, Any] | None = self._memo.get(key)
        if built is None:
            built = self._memo[key] = self._pod(namespace, name)
        return built

    def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        spec: dict[str, list[dict[str, str]]] = {"initContainers": [], "containers": []}
        for container, init in self.containers:
            spec["initContainers" if init else "containers"].append({"name": container})
        metadata = {"namespace": namespace, "name": name, "annotations": dict(self.annotations)}
        return {"metadata": metadata, "spec": spec}

    def fit(self, devices: NodeGPUs | None, context: FitContext) -> VendorFit | VendorUnfit:
        by_word = self._memo.get("by_word")
        if by_word is None:
            by_word = self._memo["by_word"] = {v.names.common_word: v for v in self.vendors}
        return fit_vendor_pod(
            devices.gpus if devices is not None else (),
            self.by_container_memo,
            inits=self.inits,
            vendors=by_word,
            context=context,
        )


def _vendor_quota(check: QuotaCheck | None) -> dict[str, QuotaEntry]:
    """The namespace's other-vendor quota entries a vendor's Fit reads (Cambricon's), from the ask's
    quota check."""
    if not isinstance(check, NamespaceQuota):
        return {}
    limits, used = check.limits, check.used
    names = {name for name, _ in limits.others} | {name for name, _ in used.others}
    return {name: QuotaEntry(used.other(name), limits.other(name)) for name in names}


@functools.lru_cache(maxsize=8)
def _others(vendors: tuple[Vendor, ...]) -> tuple[Vendor, ...]:
    return tuple(v for v in vendors if not v.native)


@functools.lru_cache(maxsize=8)
def _resources(vendors: tuple[Vendor, ...]) -> frozenset[str]:
    return frozenset(r for v in vendors for r in v.names.resources)


def _names(container: Mapping[str, Any], names: frozenset[str]) -> bool:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return False
    for part in ("limits", "requests"):
        values = resources.get(part)
        if isinstance(values, Mapping) and not names.isdisjoint(values):
            return True
    return False


def read_vendor_ask(pod: Mapping[str, Any], vendors: Sequence[Vendor]) -> VendorAsk | None:
    """The pod's requests of `vendors` (the registry's, NVIDIA excluded), None when it asks none of them."""
    others = _others(tuple(vendors))
    if not others:
        return None
    containers = pod_containers(pod)
    resources = _resources(others)
    if not any(_names(container, resources) for container, _ in containers):
        return None  # most pods: no container names another vendor's resource
    requests = []
    for container, _ in containers:
        asked = []
        for vendor in others:
            request = vendor.request(container)
            if request is not None and request.nums > 0:
                asked.append((vendor.names.common_word, request))
        requests.append(tuple(asked))
    if not any(requests):
        return None
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    pairs = tuple((k, v) for k, v in (annotations or {}).items() if isinstance(k, str) and isinstance(v, str))
    names = tuple((str(c.get("name", "")), init) for c, init in containers)
    asked_words = {w for container in requests for w, _ in container}
    used = tuple(v for v in others if v.names.common_word in asked_words)
    return VendorAsk(tuple(requests), pairs, names, used)


@dataclass(frozen=True, slots=True)
class PodAsk:
    """Everything about the pod that fitting and scoring need, read once per request (or once per
    scheduling cycle by the service, see `scheduling`). Equal asks fit and score alike."""

    namespace: str
    name: str
    requests: tuple[tuple[ContainerRequest | None, bool], ...]
    """(request or None, is init container) per container, init containers first."""
    selector: DeviceSelector
    gpu_policy: tuple[GPUPolicy, ...]
    node_policy: NodePolicy
    weights: ScoringWeights
    quota: QuotaCheck | None = None
    sidecars: frozenset[int] = frozenset()
    """Indexes of the restartable init containers (they keep running beside later containers)."""
    mix: TaskMix = DEFAULT_MIX
    """The task mix of the fragmentation policies: the one in use when the ask was read (configured, or
    learned from the pods observed, `frag_mix`)."""
    vendors: VendorAsk | None = None
    """What the pod asks of the other vendors (None: nothing)."""

    @property
    def kinds(self) -> tuple[ContainerKind, ...]:
        return kinds_of([init for _, init in self.requests], self.sidecars)

    @property
    def asks_nvidia(self) -> bool:
        return any(request is not None for request, _ in self.requests)

    def fit(
        self,
        node: NodeGPUs | None,
        vendor_devices: NodeGPUs | None = None,
        *,
        device_pods: DevicePods | None = None,
        qos: Mapping[str, str] | None = None,
    ) -> FitResult:
        """The pod on a node: its NVIDIA GPUs (`node`, None when the node has no registered NVIDIA GPUs)
        by `fit.fit_pod`, and its other vendors' devices (`vendor_devices`) by HAMi's per-vendor Fit
        (`device_pods`, `qos`: what Metax sGPU's Fit reads, `FitContext`)."""
        if self.asks_nvidia:
            if node is None:
                return FitFailure((), 0, True, text="NodeInsufficientDevice")
            result = fit_pod(
                node,
                self.requests,
                selector=self.selector,
                policy=self.gpu_policy,
                quota=self.quota,
                weights=self.weights,
                sidecars=self.sidecars,
                mix=self.mix,
            )
            if self.vendors is None or not isinstance(result, Fit):
                return result
            allocation = result.allocation
        else:
            allocation = PodAllocation(tuple(ContainerAllocation() for _ in self.requests))
        assert self.vendors is not None
        if vendor_devices is None:  # no device of any other vendor here (an NVIDIA node)
            return FitFailure((), 0, True, text=NODE_INSUFFICIENT_DEVICE)
        short = too_few(vendor_devices.gpus, self.vendors.by_container_memo)
        if short is not None:
            return FitFailure((), 0, True, short, text=NODE_INSUFFICIENT_DEVICE)
        context = FitContext(
            self.vendors.pod(self.namespace, self.name),
            {"metadata": {"name": node.name if node is not None else ""}},
            self.gpu_policy,
            quota=_vendor_quota(self.quota),
            device_pods=device_pods or {},
            qos_cache=qos or {},
        )
        outcome = self.vendors.fit(vendor_devices, context)
        if isinstance(outcome, VendorUnfit):
            unresolvable = vendor_devices is None or outcome.message == "NodeInsufficientDevice"
            return FitFailure((), 0, unresolvable, outcome.container, text=outcome.message)
        return Fit(allocation, outcome)

    def priority(self, node: NodeGPUs | None, fit: Fit, vendor_devices: NodeGPUs | None = None) -> int:
        """0..10 by the node policy, the node with the pod's chosen slices at their peak (the NVIDIA GPUs
        when the pod asks some, else the other vendors' devices)."""
        if node is not None and self.asks_nvidia:
            slices = footprint_slices(fit.allocation, self.kinds)
            return node_priority(node, slices, self.node_policy, self.mix)
        if vendor_devices is None or fit.vendors is None:
            return 0
        slices = tuple(s for a in fit.vendors.allocations.values() for s in footprint_slices(a, self.kinds))
        return node_priority(vendor_devices, slices, self.node_policy, self.mix)

    def under_quota(self, quota: QuotaView | None, config: ControlConfig) -> PodAsk:
        """This ask checked against `quota` now (its namespace's limits and usage as they are); without a
        view, or with quotas not enforced, unchecked."""
        check = _quota_check(self.namespace, quota) if quota is not None and config.quota.enforce else None
        return self if check == self.quota else replace(self, quota=check)


ASK_ANNOTATIONS = (
    USE_GPU_TYPE,
    NOUSE_GPU_TYPE,
    USE_GPU_UUID,
    NOUSE_GPU_UUID,
    VGPU_MODE,
    NUMA_BIND,
    GPU_SCHEDULER_POLICY,
    NODE_SCHEDULER_POLICY,
    DEVICE_SCORING_WEIGHTS,
)
"""The pod annotations `read_pod_ask` reads (selectors, policies, weights): a store that keeps these and
the parsed requests can rebuild the ask (`ask_from_requests`)."""

_NO_SIDECARS: frozenset[int] = frozenset()


def _metadata(pod: Mapping[str, Any]) -> tuple[str, str, Mapping[str, str]]:
    metadata = pod.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, Mapping):
        raise ExtenderArgsError(f"Pod.metadata: expected an object, got {_kind(metadata)}")
    values: dict[str, str] = {}
    for key in ("namespace", "name"):
        value = metadata.get(key)
        value = "" if value is None else value
        if not isinstance(value, str):
            raise ExtenderArgsError(f"Pod.metadata.{key}: expected a string, got {_shown(value)}")
        values[key] = value
    annotations = metadata.get("annotations")
    annotations = {} if annotations is None else annotations
    if not isinstance(annotations, Mapping):
        raise ExtenderArgsError(f"Pod.metadata.annotations: expected an object, got {_kind(annotations)}")
    for key, value in annotations.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ExtenderArgsError(
                f"Pod.metadata.annotations[{_shown(key)}]: expected a string, got {_shown(value)}"
            )
    return values["namespace"] or "default", values["name"], annotations


def _quota_check(namespace: str, view: QuotaView) -> NamespaceQuota | None:
    """The check of the pod's usage against the namespace's limits, None when it has none."""
    limits = view.limits(namespace)
    if limits.unlimited:
        return None
    return NamespaceQuota(limits, view.used(namespace))


def _given(annotations: Mapping[str, Any], key: str) -> bool:
    """Whether the annotation is set to something other than blank text."""
    value = annotations.get(key)
    return value is not None and not (isinstance(value, str) and not value.strip())


def _who(namespace: str, name: str) -> str:
    return f"pod {namespace}/{name or '?'}"


def read_pod_ask(
    pod: object, config: ControlConfig, quota: QuotaView | None = None, *, mix: TaskMix | None = None
) -> PodAsk | None:
    """The pod's GPU ask, or None when it asks for no GPU (no HAMi resource, or no GPU count anywhere).
    Pod annotations override the config's node and GPU policies; `mix`, the fragmentation policies'
    task mix in use (None: the configured one). Raises `ExtenderArgsError` naming the pod and the bad
    field."""
    if pod is None:
        raise ExtenderArgsError("ExtenderArgs.Pod: missing")
    if not isinstance(pod, Mapping):
        raise ExtenderArgsError(f"ExtenderArgs.Pod: expected a Pod object, got {_kind(pod)}")
    namespace, name, annotations = _metadata(pod)
    names, defaults = config.requests.names, config.requests.defaults
    try:
        vendors = read_vendor_ask(pod, config.registry.vendors)
        if vendors is None and not pod_has_hami_resource(pod, names):
            return None
        containers = pod_containers(pod)
        requests = tuple(
            (container_request(container, names, defaults, init), init) for container, init in containers
        )
        sidecars = frozenset(
            i for i, (c, init) in enumerate(containers) if container_kind(c, init) is ContainerKind.SIDECAR
        )
    except (RequestError, WireFormatError, QuantityError) as err:
        raise ExtenderArgsError(f"{_who(namespace, name)}: {err}") from None
    ask = ask_from_requests(
        namespace, name, annotations, requests, sidecars, config, mix=mix, vendors=vendors
    )
    return None if ask is None else ask.under_quota(quota, config)


def ask_from_requests(  # noqa: PLR0917 (the parts of a pod, named)
    namespace: str,
    name: str,
    annotations: Mapping[str, str],
    requests: tuple[tuple[ContainerRequest | None, bool], ...],
    sidecars: frozenset[int],
    config: ControlConfig,
    *,
    mix: TaskMix | None = None,
    vendors: VendorAsk | None = None,
) -> PodAsk | None:
    """`read_pod_ask` (without a quota) for a pod whose requests are already read: decodes the selector,
    policy and weight annotations (`ASK_ANNOTATIONS`). `namespace` as `read_pod_ask` gives it ("default"
    for none); `mix` as `read_pod_ask` takes it. Raises `ExtenderArgsError` like it."""
    if vendors is None and all(request is None for request, _ in requests):
        return None
    try:
        selector = decode_device_selector(annotations)
        # An empty (or blank) policy annotation means the configured default, as in HAMi (its empty
        # value sorts as its defaults, spread for GPUs and binpack for nodes); an unknown one is an error.
        gpu_policy = config.scheduling.gpu_policy
        if _given(annotations, GPU_SCHEDULER_POLICY):
            gpu_policy = decode_gpu_policy(annotations[GPU_SCHEDULER_POLICY])
        node_policy = config.scheduling.node_policy
        if _given(annotations, NODE_SCHEDULER_POLICY):
            node_policy = decode_node_policy(annotations[NODE_SCHEDULER_POLICY])
        weights = DEFAULT_WEIGHTS
        if DEVICE_SCORING_WEIGHTS in annotations:
            weights = decode_scoring_weights(annotations[DEVICE_SCORING_WEIGHTS])
    except (RequestError, WireFormatError, QuantityError) as err:
        raise ExtenderArgsError(f"{_who(namespace, name)}: {err}") from None
    return PodAsk(
        namespace,
        name,
        requests,
        NO_SELECTOR if selector == NO_SELECTOR else selector,  # one shared value for most pods
        gpu_policy,
        node_policy,
        weights,
        None,
        sidecars or _NO_SIDECARS,
        config.scheduling.configured_mix if mix is None else mix,
        vendors,
    )


# --- filter -----------------------------------------------------------------------------------------------


def _filter_result(
    candidates: Candidates | None,
    fitting: Sequence[int] = (),
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> dict[str, Any]:
    nodes: dict[str, Any] | None = None
    names: list[str] | None = None
    if candidates is not None and not error:
        if candidates.node_list is None:
            names = [candidates.names[i] for i in fitting]
        else:
            nodes = dict(candidates.node_list)
            nodes["items"] = [candidates.items[i] for i in fitting]
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed or {}),
        "FailedAndUnresolvableNodes": dict(unresolvable or {}),
        "Error": error,
    }


def failure_reason(failure: FitFailure) -> str:
    """The FailedNodes text of a node the pod does not fit on (see the module note)."""
    return failure.message


def unregistered_reason(view: NodeView, name: str) -> str:
    """`node unregistered: <why>` (the view's reason carries the prefix already)."""
    why = view.unregistered_reason(name)
    if why is None:
        return f"{UNREGISTERED}: {NOT_CACHED}"
    return why if why.startswith(UNREGISTERED) else f"{UNREGISTERED}: {why}"


_NO_POSITIONS: IntArray = np.zeros(0, dtype=np.int64)
_NO_POSITIONS.flags.writeable = False


@dataclass(slots=True)
class FilterAnswer:
    """An ExtenderFilterResult before it is written out: `as_dict` gives the JSON object, `as_json` its
    bytes. The nodes the GPU table failed are kept as candidate positions with the ids of their texts
    in `texts` (`gputable.ReasonTexts`), so that thousands of failed nodes cost a few array operations;
    `failed` / `unresolvable` hold the others (fitted node by node, left out by the narrowing,
    unregistered). `as_json` writes the table's failures grouped by text (one join per text); a JSON
    object's order carries no meaning (kube-scheduler reads FailedNodes into a Go map), and `as_dict`
    keeps the order of the plain computation: `failed` / `unresolvable` first, then the table's failures
    in candidate order."""

    candidates: Candidates
    fitting: Sequence[int] | IntArray
    """Candidate positions that fit, ascending."""
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    table: GPUTable | None = None
    failing: IntArray = field(default_factory=lambda: _NO_POSITIONS)
    """Candidate positions the table failed (nodes it has, ascending)."""
    failing_text: IntArray = field(default_factory=lambda: _NO_POSITIONS)
    """The id of each failing position's text in `texts`."""
    failing_unresolvable: BoolArray | None = None
    """Per failing position: in FailedAndUnresolvableNodes rather than FailedNodes."""
    texts: ReasonTexts | None = None
    error: str = ""
    _answered: Candidates | None = None

    @property
    def fits_any(self) -> bool:
        return len(self.fitting) > 0

    def without_failed(self) -> None:
        """Name no failed node (`--filter-failed-nodes when-none-fit`, for a pod that fits somewhere):
        `as_dict` and `as_json` then write empty FailedNodes and FailedAndUnresolvableNodes."""
        self.failed, self.unresolvable = {}, {}
        self.failing = self.failing_text = _NO_POSITIONS
        self.failing_unresolvable = None

    def answered(self) -> Candidates | None:
        """The nodes answered as fitting as candidates (in NodeNames' order, with the JSON NodeNames is
        written with and their table rows), or None when the answer is not written from the table's
        fragments. kube-scheduler's /prioritize request names them again when its own filters kept
        them all (`CandidateLists.remember`)."""
        kept = self._answered
        if kept is not None:
            return kept
        candidates, table = self.candidates, self.table
        if self.error or candidates.node_list is not None or table is None or not candidates.unique(table):
            return None
        fitting = self.fitting
        if len(fitting) == len(candidates.names) and candidates.names_json is not None:
            kept = candidates  # every candidate fits: the list as the request wrote it
        else:
            positions = fitting if isinstance(fitting, np.ndarray) else np.asarray(fitting, dtype=np.int64)
            names = candidates.names
            kept = Candidates(
                tuple([names[p] for p in positions.tolist()]),
                names_json=b"[" + b",".join(candidates.name_json(table, positions)) + b"]",
            )
            rows, _ = candidates.rows(table)
            at = rows[positions]
            if not len(at) or int(at.min()) >= 0:
                known = np.arange(len(at), dtype=np.int64)
                at.flags.writeable = False
                known.flags.writeable = False
                kept._memo["rows"] = (table, table.layout, at, known)
                kept._memo["unique"] = True
        self._answered = kept
        return kept

    def _table_failures(self, unresolvable: bool) -> tuple[IntArray, IntArray]:
        flags = self.failing_unresolvable
        if flags is None or not len(self.failing):
            return _NO_POSITIONS, _NO_POSITIONS
        mask = flags if unresolvable else ~flags
        return self.failing[mask], self.failing_text[mask]

    def as_dict(self) -> dict[str, Any]:
        candidates = self.candidates
        if self.error:
            return _filter_result(None, error=self.error)
        failed, unresolvable = dict(self.failed), dict(self.unresolvable)
        if self.texts is not None:
            texts, names = self.texts.texts, candidates.names
            for target, flag in ((failed, False), (unresolvable, True)):
                positions, ids = self._table_failures(flag)
                shown = [texts[i] for i in ids.tolist()]
                target.update(zip([names[p] for p in positions.tolist()], shown, strict=True))
        fitting = self.fitting.tolist() if isinstance(self.fitting, np.ndarray) else self.fitting
        return _filter_result(candidates, fitting, failed, unresolvable)

    def as_json(self) -> bytes:
        """The answer's JSON (what `orjson.dumps(self.as_dict())` decodes to, written with the table's
        JSON fragments of the names)."""
        answered = self.answered()
        if answered is None or answered.names_json is None:
            return orjson.dumps(self.as_dict())
        return b"".join(
            (
                b'{"Nodes":null,"NodeNames":',
                answered.names_json,
                b',"FailedNodes":{',
                self._object_json(self.failed, False),
                b'},"FailedAndUnresolvableNodes":{',
                self._object_json(self.unresolvable, True),
                b'},"Error":""}',
            )
        )

    def _object_json(self, given: dict[str, str], unresolvable: bool) -> bytes:
        """The members of FailedNodes (or FailedAndUnresolvableNodes), without the braces."""
        parts: list[bytes] = []
        if given:
            parts.append(orjson.dumps(given)[1:-1])
        positions, ids = self._table_failures(unresolvable)
        if len(positions) and self.texts is not None and self.table is not None:
            table, text_json = self.table, self.texts.json
            rows, _ = self.candidates.rows(table)
            at = rows[positions]
            if int(ids.min()) == int(ids.max()):  # one text (most often)
                groups = [(int(ids[0]), at)]
            else:
                order = np.argsort(ids, kind="stable")
                split = np.split(order, np.flatnonzero(np.diff(ids[order])) + 1)
                groups = [(int(ids[group[0]]), at[group]) for group in split]
            for text_id, group_rows in groups:
                value = text_json[text_id]
                written = table.members_json(group_rows, value)
                if written is None:
                    text = b":" + value
                    written = (text + b",").join(table.name_json[group_rows].tolist()) + text
                parts.append(written)
        return b",".join(parts)


UNREGISTERED_WORD = "NodeUnregistered"
"""The filter-reason counter's word for unregistered nodes."""
NOT_LEAST_FRAGMENTING = "not the least fragmenting node (--fragmentation-filter best)"
NOT_LEAST_FRAGMENTING_WORD = "NotLeastFragmenting"
"""FailedNodes text and counter word of a fitting node `--fragmentation-filter best` leaves out (the
word also counts those `one` leaves out)."""


@dataclass(frozen=True, slots=True)
class HostCPU:
    """What `--fragmentation-filter best` / `one` measures nodes' CPU by: each node's free CPU (milli-cores;
    None: unknown, then every shape counts as hosted there) and the pod's own request. `one`: answer the
    one node of FGD's best score, first by name (`--fragmentation-filter one`), instead of every node of
    the least growth."""

    free: Callable[[str], int | None]
    pod: int
    one: bool = False
    free_array: Callable[[Sequence[str]], IntArray] | None = None
    """`free_of` for many nodes at once (the service's: `scheduling.Extender.cpu_free_of`, two dict
    lookups per node in C instead of a Python call); `free` node by node when None. Both must answer
    the same."""

    def free_of(self, names: Sequence[str]) -> IntArray:
        """The free CPU of each node of `names` (unknown: more than any task asks)."""
        if self.free_array is not None:
            return self.free_array(names)
        cpu = [self.free(name) for name in names]
        return np.array([UNKNOWN_CPU if c is None else c for c in cpu], dtype=np.int64)


UNKNOWN_CPU = 2**40
"""Free CPU of a node whose allocatable is unknown: more than any task asks."""


NodeFit = Callable[[str, NodeGPUs | None], FitResult]
"""(node name, its GPUs) -> the pod's fit there: the seam through which the service reuses the GPU choices
of a scheduling cycle (`cycle.PodCycle.fitter`); plain `PodAsk.fit` otherwise."""


def filter_pod(
    args: object,
    view: NodeView,
    config: ControlConfig,
    quota: QuotaView | None = None,
    *,
    table: GPUTable | None = None,
    reasons: Counter[str] | None = None,
    cache: RowCache | None = None,
) -> dict[str, Any]:
    """ExtenderArgs JSON (already decoded) -> ExtenderFilterResult JSON. Never raises on bad input.

    With `table` (in step with `view`, see `gputable`), pods it covers are answered for all candidates
    at once; others go node by node through `fit_pod`. `reasons`, when given, gets +1 per failed node
    for each reason word in its answer (for the metrics). `cache`: as in `filter_nodes`."""
    try:
        candidates = read_candidates(args)
        ask = read_pod_ask(_args(args).get("Pod"), config, quota)
    except ExtenderArgsError as err:
        log.debug("filter: %s", err)
        return filter_error(str(err))
    return filter_nodes(ask, candidates, view, table=table, reasons=reasons, cache=cache)


def filter_error(message: str) -> dict[str, Any]:
    """The ExtenderFilterResult of a request that cannot be answered."""
    return _filter_result(None, error=message)


def filter_nodes(
    ask: PodAsk | None,
    candidates: Candidates,
    view: NodeView,
    *,
    table: GPUTable | None = None,
    reasons: Counter[str] | None = None,
    fit: NodeFit | None = None,
    narrow: HostCPU | None = None,
    cache: RowCache | None = None,
) -> dict[str, Any]:
    """`filter_pod` for an ask already read: the ExtenderFilterResult over `candidates`. Nodes the table
    does not answer are fitted one by one with `fit` (default `ask.fit`). `narrow`
    (`--fragmentation-filter best`): a pod under the fragmentation node policy that the table answers
    gets only its least fragmenting nodes (`gputable.fragmentation_growth`, CPU from `narrow`); the
    other fitting nodes fail with `NOT_LEAST_FRAGMENTING`. `cache` (a `RowCache` of `table`): the
    table's per-node answers kept from one request to the next (the same answer)."""
    return filter_answer(
        ask, candidates, view, table=table, reasons=reasons, fit=fit, narrow=narrow, cache=cache
    ).as_dict()


def filter_answer(
    ask: PodAsk | None,
    candidates: Candidates,
    view: NodeView,
    *,
    table: GPUTable | None = None,
    reasons: Counter[str] | None = None,
    fit: NodeFit | None = None,
    narrow: HostCPU | None = None,
    cache: RowCache | None = None,
) -> FilterAnswer:
    """`filter_nodes` as a `FilterAnswer` (written out by the service without building the JSON object)."""
    if ask is None:
        return FilterAnswer(candidates, range(len(candidates.names)), table=table)
    fit_node: NodeFit = fit if fit is not None else _fit_on(ask, view)
    if table is not None and ask.vendors is None:
        if ask.node_policy is not NodePolicy.FRAGMENTATION:
            narrow = None
        fast = _filter_vectorised(ask, candidates, view, table, reasons, narrow, fit_node, cache)
        if fast is not None:
            return fast
    fitting: list[int] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    nvidia = ask.asks_nvidia
    for index, name in enumerate(candidates.names):
        node = view.node_gpus(name)
        if node is None and nvidia:
            unresolvable[name] = unregistered_reason(view, name)
            if reasons is not None:
                reasons[UNREGISTERED_WORD] += 1
            continue
        if not nvidia and view.vendor_devices(name) is None:
            # No device of any other vendor in service here: why, when a vendor's were left out.
            problems = view.vendor_problems(name)
            unresolvable[name] = (
                f"{UNREGISTERED}: {'; '.join(problems)}" if problems else NODE_INSUFFICIENT_DEVICE
            )
            if reasons is not None:
                reasons[UNREGISTERED_WORD if problems else NODE_INSUFFICIENT_DEVICE] += 1
            continue
        result = fit_node(name, node)
        if isinstance(result, Fit):
            fitting.append(index)
            failed.pop(name, None)
            unresolvable.pop(name, None)
            continue
        if result.unresolvable:
            unresolvable[name] = failure_reason(result)
        else:
            failed[name] = failure_reason(result)
        if reasons is not None:
            if result.text:
                for part in result.text.split(", "):
                    reasons[part.split(" ")[-1]] += 1
                continue
            for reason, _ in result.reasons or ((Reason.NODE_INSUFFICIENT_DEVICE, 0),):
                reasons[reason.value] += 1
    return FilterAnswer(candidates, fitting, failed, unresolvable)


def _fit_on(ask: PodAsk, view: NodeView) -> NodeFit:
    """`ask.fit` on a node of `view` (with its other vendors' devices when the pod asks some)."""
    if ask.vendors is None:
        return lambda _name, node: ask.fit(node)
    return lambda name, node: fit_with_vendors(ask, view, name, node)


class VendorView(Protocol):
    """What a vendor pod's fit reads of the cluster besides the node's GPUs (`cache.ClusterCache`)."""

    def vendor_devices(self, name: str) -> NodeGPUs | None: ...

    def device_pods(self, name: str) -> DevicePods: ...

    @property
    def expectations(self) -> Mapping[str, str]: ...


def fit_with_vendors(ask: PodAsk, view: VendorView, name: str, node: NodeGPUs | None) -> FitResult:
    """`ask.fit` on node `name` with its other vendors' devices, and for a vendor whose Fit reads them
    (`Vendor.uses_device_pods`) the pods on each device and the vendors' expectations."""
    vendors = ask.vendors
    if vendors is None:
        return ask.fit(node)
    if not vendors.uses_device_pods:
        return ask.fit(node, view.vendor_devices(name))
    return ask.fit(node, view.vendor_devices(name), device_pods=view.device_pods(name), qos=view.expectations)


def _filter_vectorised(  # noqa: PLR0917 (the filter's inputs, named)
    ask: PodAsk,
    candidates: Candidates,
    view: NodeView,
    table: GPUTable,
    reasons: Counter[str] | None,
    narrow: HostCPU | None = None,
    fit_node: NodeFit | None = None,
    cache: RowCache | None = None,
) -> FilterAnswer | None:
    simple = simple_ask(table, ask.requests, ask.selector, ask.gpu_policy, ask.quota)
    if simple is None:
        return None
    names = candidates.names
    rows, known = candidates.rows(table)
    known_rows = rows[known]
    ev: Evaluation | None = None
    if cache is not None:
        fits_all, unresolvable_all, text_all = cache.verdicts(simple)
        fits, unresolvable_known = fits_all[known_rows], unresolvable_all[known_rows]
        slow = table.mig[known_rows] if table.mig_rows else None
        texts = cache.texts
    else:
        ev = evaluate(table, known_rows, simple)
        fits, unresolvable_known, slow = ev.fits, ev.unresolvable, ev.slow
        texts = ReasonTexts()
    fitting: IntArray | list[int] = known[fits]
    failed: dict[str, str] = {}
    if narrow is not None and int(np.count_nonzero(fits)) > 1:
        fitting = _least_fragmenting(
            ask, names, known, known_rows, fits, ev, table, simple, narrow, failed, reasons, cache
        )
    unresolvable: dict[str, str] = {}
    failing = np.flatnonzero(~fits)
    if slow is not None and slow.any():
        # Nodes with a MIG-mode GPU: HAMi's per-placement rules, node by node (their failures are not
        # the table's).
        failing = np.flatnonzero(~fits & ~slow)
        fitting = sorted(
            [
                *np.asarray(fitting).tolist(),
                *_fit_slow(ask, names, known[slow], view, fit_node, failed, unresolvable, reasons),
            ]
        )
    if len(known) < len(rows):
        for index in np.flatnonzero(rows < 0).tolist():
            unresolvable[names[index]] = unregistered_reason(view, names[index])
            if reasons is not None:
                reasons[UNREGISTERED_WORD] += 1
    if len(failing):
        if ev is None:
            failing_text = text_all[known_rows[failing]]
        else:
            patterns, which = group_rows(ev.failure_counts(table, failing))
            ids = np.array([texts.intern(p) for p in patterns.tolist()], dtype=np.int64)
            failing_text = ids[which]
        if reasons is not None:
            per_text = np.bincount(failing_text, minlength=len(texts)).tolist()
            for text, nodes in enumerate(per_text):
                if nodes:
                    for word in texts.words[text]:
                        reasons[word] += nodes
        return FilterAnswer(
            candidates,
            fitting,
            failed,
            unresolvable,
            table,
            known[failing],
            failing_text,
            unresolvable_known[failing],
            texts,
        )
    return FilterAnswer(candidates, fitting, failed, unresolvable, table)


def _fit_slow(  # noqa: PLR0917 (the vectorised filter's state, named)
    ask: PodAsk,
    names: Sequence[str],
    positions: IntArray,
    view: NodeView,
    fit_node: NodeFit | None,
    failed: dict[str, str],
    unresolvable: dict[str, str],
    reasons: Counter[str] | None,
) -> list[int]:
    """The candidates at `positions` fitted one by one (`fit_node`, default `ask.fit`): the positions
    that fit; the others go to `failed` / `unresolvable` with their reason."""
    fit_with = fit_node if fit_node is not None else _fit_on(ask, view)
    fitting: list[int] = []
    for pos in positions.tolist():
        name = names[pos]
        result = fit_with(name, view.node_gpus(name))
        if isinstance(result, Fit):
            fitting.append(pos)
            continue
        (unresolvable if result.unresolvable else failed)[name] = failure_reason(result)
        if reasons is not None:
            for reason, _ in result.reasons or ((Reason.NODE_INSUFFICIENT_DEVICE, 0),):
                reasons[reason.value] += 1
    return fitting


def _least_fragmenting(  # noqa: PLR0917 (the vectorised filter's state, named)
    ask: PodAsk,
    names: Sequence[str],
    known: IntArray,
    known_rows: IntArray,
    fits: BoolArray,
    ev: Evaluation | None,
    table: GPUTable,
    simple: SimpleAsk,
    narrow: HostCPU,
    failed: dict[str, str],
    reasons: Counter[str] | None,
    cache: RowCache | None,
) -> IntArray:
    """The fitting candidates (positions in `names`) where the fragmentation grows least; the others go
    to `failed` with `NOT_LEAST_FRAGMENTING`. Equal growths are all kept: kube-scheduler's score chooses.
    With `narrow.one`: the one candidate of FGD's best score (`gputable.fragmentation_best_scores`), among
    equal ones the fuller node, then the first by name (`frag.first_best`). From `cache` when given
    (per node, caught up with the nodes whose GPUs or free CPU changed), else from `ev`."""
    request = simple.request
    if len(known) == len(names):
        known_names: Sequence[str] = names
    else:
        known_names = [names[i] for i in known.tolist()]
    values: FloatArray | IntArray
    if cache is not None:
        values = cache.host_fragmentation(simple, ask.mix, narrow.free_of, narrow.pod, narrow.one)[known_rows]
    else:
        assert ev is not None
        cpu_free = narrow.free_of(known_names)
        if narrow.one:
            values = fragmentation_best_scores(table, ev, request, ask.mix, cpu_free, narrow.pod)
        else:
            values = fragmentation_growth(table, ev, request, ask.mix, cpu_free, narrow.pod)
    if narrow.one:
        score = np.where(fits, values, NO_PLACEMENT - 1)
        best = np.zeros(len(known), dtype=np.bool_)
        best[first_best(score, known_names, free_total_rows(table, known_rows))] = True
        left_out = known[fits & ~best].tolist()  # not answered (the module note)
    else:
        growth = np.where(fits, values, np.inf)
        best = fits & (growth == growth.min())
        left_out = known[fits & ~best].tolist()
        failed.update((names[i], NOT_LEAST_FRAGMENTING) for i in left_out)
    if reasons is not None and left_out:
        reasons[NOT_LEAST_FRAGMENTING_WORD] += len(left_out)
    result: IntArray = known[best]
    return result


# --- pods that ask no GPU (the second extender entry) -----------------------------------------------------


def cpu_filter_nodes(
    candidates: Candidates, table: GPUTable, mix: TaskMix, narrow: HostCPU
) -> dict[str, Any]:
    """`/cpu-filter` for a pod that asks no GPU under `--fragmentation-filter one`: the one candidate of
    FGD's best score for it (`frag.cpu_only_scores_at`: how its CPU changes which of the mix's shapes each
    node's free CPU still hosts; a node the GPU table does not have counts with no GPU free), among equal
    ones the fuller node, then the first by name (`frag.first_best`). kube-scheduler has run its own
    filters first (NodeResourcesFit, affinity, taints: pkg/scheduler/schedule_one.go
    `findNodesThatFitPod` calls `findNodesThatPassExtenders` on their feasible nodes), so the one node
    answered is one it accepts, and with one feasible node it binds without scoring (`schedulePod`).

    The other candidates are left out of the answer, FailedNodes included (the module note): with a node
    kept the pod has a feasible node, and kube-scheduler reads failed nodes only to explain a pod that
    has none (the FitError of its FailedScheduling event) or to preempt for it."""
    names = candidates.names
    if len(names) <= 1:
        return _filter_result(candidates, range(len(names)))
    rows = table.rows(names)

    def free_at(positions: IntArray) -> IntArray:
        return free_milli_rows(table, rows[positions])

    score = cpu_only_scores_at(free_at, mix, narrow.free_of(names), narrow.pod)
    chosen = first_best(score, names, free_total_rows(table, rows))
    return _filter_result(candidates, (chosen,))


def pass_through(candidates: Candidates) -> dict[str, Any]:
    """The ExtenderFilterResult that keeps every candidate (what `/cpu-filter` answers a pod it does not
    decide for)."""
    return _filter_result(candidates, range(len(candidates.names)))


def zero_scores(candidates: Candidates) -> list[dict[str, Any]]:
    """A HostPriorityList of 0 for every candidate (what `/cpu-prioritize` answers: the decision is
    /cpu-filter's, and 0 adds nothing to kube-scheduler's total)."""
    return [{"Host": host, "Score": 0} for host in dict.fromkeys(candidates.names)]


# --- prioritize -------------------------------------------------------------------------------------------


def prioritize_pod(
    args: object,
    view: NodeView,
    config: ControlConfig,
    quota: QuotaView | None = None,
    *,
    table: GPUTable | None = None,
    cache: RowCache | None = None,
) -> list[dict[str, Any]]:
    """ExtenderArgs JSON -> HostPriorityList JSON, every candidate scored 0..10. Never raises on bad input.
    `table` and `cache` as in `filter_pod`."""
    try:
        candidates = read_candidates(args)
    except ExtenderArgsError as err:
        log.debug("prioritize: %s", err)
        return []
    try:
        ask = read_pod_ask(_args(args).get("Pod"), config, quota)
    except ExtenderArgsError as err:
        log.debug("prioritize: %s", err)
        ask = None
    return prioritize_nodes(ask, candidates, view, table=table, cache=cache)


def prioritize_nodes(
    ask: PodAsk | None,
    candidates: Candidates,
    view: NodeView,
    *,
    table: GPUTable | None = None,
    fit: NodeFit | None = None,
    cache: RowCache | None = None,
) -> list[dict[str, Any]]:
    """`prioritize_pod` for an ask already read (None: asks no GPU, or unreadable). Nodes the table does
    not score are fitted one by one with `fit` (default `ask.fit`). `cache`: as in `filter_nodes`."""
    return prioritize_answer(ask, candidates, view, table=table, fit=fit, cache=cache).as_list()


@dataclass(frozen=True, slots=True)
class PrioritizeAnswer:
    """A HostPriorityList before it is written out: `as_list` gives the JSON list, `as_json` its bytes."""

    hosts: Sequence[str]
    """One per candidate name (its first occurrence), in the candidates' order."""
    scores: Sequence[int] | IntArray
    rows: IntArray | None = None
    """The table row of each host (-1: not in the table), when the hosts are the candidates (no name
    given twice); None otherwise."""
    table: GPUTable | None = None

    def as_list(self) -> list[dict[str, Any]]:
        scores = self.scores.tolist() if isinstance(self.scores, np.ndarray) else self.scores
        return [{"Host": host, "Score": value} for host, value in zip(self.hosts, scores, strict=True)]

    def as_json(self) -> bytes:
        """The answer's JSON (what `orjson.dumps(self.as_list())` decodes to, in the same order), written
        with the table's JSON fragments of the hosts."""
        table, rows = self.table, self.rows
        scores = np.asarray(self.scores, dtype=np.int64)
        if table is None or rows is None or not len(scores):
            return orjson.dumps(self.as_list())
        if int(scores.min()) < 0 or int(scores.max()) > MAX_SCORE:
            return orjson.dumps(self.as_list())
        if int(rows.min()) >= 0:
            written = table.priorities_json(rows, scores)
            if written is not None:
                return written
        starts = table.host_json[np.maximum(rows, 0)].tolist()
        if int(rows.min()) < 0:
            for pos in np.flatnonzero(rows < 0).tolist():
                starts[pos] = b'{"Host":' + orjson.dumps(self.hosts[pos]) + b',"Score":'
        parts: list[bytes] = [b""] * (2 * len(starts))
        parts[0::2] = starts
        parts[1::2] = map(_SCORE_ENDS.__getitem__, scores.tolist())
        return b"[" + b"".join(parts)[:-1] + b"]"


_SCORE_ENDS = [b"%d}," % score for score in range(MAX_SCORE + 1)]
"""The end of a HostPriority entry per score, with the comma before the next: `<score>},`."""


def prioritize_answer(
    ask: PodAsk | None,
    candidates: Candidates,
    view: NodeView,
    *,
    table: GPUTable | None = None,
    fit: NodeFit | None = None,
    cache: RowCache | None = None,
) -> PrioritizeAnswer:
    """`prioritize_nodes` as a `PrioritizeAnswer`."""
    unique = table is not None and candidates.node_list is None and candidates.unique(table)
    hosts: Sequence[str] = candidates.names if unique else list(dict.fromkeys(candidates.names))
    rows_of: IntArray | None = candidates.rows(table)[0] if unique and table is not None else None
    if ask is None:
        return PrioritizeAnswer(hosts, [NEUTRAL_SCORE] * len(hosts), rows_of, table)
    if ask.vendors is not None and not ask.asks_nvidia:
        by_host = _prioritize_vendors(ask, hosts, view, fit if fit is not None else _fit_on(ask, view))
        return PrioritizeAnswer(hosts, [by_host[host] for host in hosts], rows_of, table)
    score: IntArray | list[int] = [0] * len(hosts)
    exact: Sequence[int] = range(len(hosts))
    simple = simple_ask(table, ask.requests, ask.selector, ask.gpu_policy, ask.quota) if table else None
    if ask.vendors is not None:
        simple = None
    fragmentation = ask.node_policy is NodePolicy.FRAGMENTATION
    if fragmentation and not (
        simple is not None and simple.request.nums == 1 and ask.gpu_policy == (GPUPolicy.FRAGMENTATION,)
    ):
        simple = None  # scored from the GPUs fit_pod picks, node by node
    if table is not None and simple is not None:
        if rows_of is not None:
            rows, known = candidates.rows(table)
        else:
            rows = table.rows(hosts)
            known = np.flatnonzero(rows >= 0)
        known_rows = rows[known]
        mig = table.mig[known_rows] if table.mig_rows else None
        if cache is not None:
            fits = cache.verdicts(simple)[0][known_rows]
            if fragmentation:
                fast_all, slow_all = cache.fragmentation_scores(simple, ask.mix)
            else:
                fast_all, slow_all = cache.scores(simple, ask.node_policy)
            fast, slow = fast_all[known_rows], slow_all[known_rows]
        else:
            ev = evaluate(table, known_rows, simple)
            fits = ev.fits
            if fragmentation:
                fast, slow = fragmentation_scores(table, ev, simple.request, ask.mix)
            else:
                slice_mem, sums = score_inputs(table, ev)
                fast, slow = node_scores(slice_mem, sums, simple.request, ask.node_policy), slice_mem < 0
        full = np.zeros(len(hosts), dtype=np.int64)
        scored = fits & ~slow
        full[known[scored]] = fast[scored]
        score = full
        # A percentage over GPUs of different sizes (or GPUs tied on a growth that take different
        # amounts): score the GPUs fit_pod really picks; nodes with a MIG-mode GPU too.
        exact = known[fits & slow].tolist() + (known[mig].tolist() if mig is not None else [])
    fit_node: NodeFit = fit if fit is not None else _fit_on(ask, view)
    if exact:
        values = score.tolist() if isinstance(score, np.ndarray) else score
        for pos in exact:
            node = view.node_gpus(hosts[pos])
            vendor = view.vendor_devices(hosts[pos]) if ask.vendors is not None else None
            if node is not None or vendor is not None:
                result = fit_node(hosts[pos], node)
                if isinstance(result, Fit):
                    values[pos] = ask.priority(node, result, vendor)
        score = values
    return PrioritizeAnswer(hosts, score, rows_of, table)


def vendor_node_score(ask: PodAsk, devices: NodeGPUs, fit: Fit, node: Mapping[str, Any]) -> float:
    """HAMi's score of a node for a pod of the other vendors (pkg/scheduler/policy `ComputeDefaultScore`
    + `OverrideScore`): 10 x (slots + cores + memory used / total) over the node's devices before the pod,
    plus each vendor's ScoreNode for its devices (a policy-neutral one x10000, x-10000 under spread)."""
    score = 3 * node_usage(devices)
    if fit.vendors is None or ask.vendors is None:
        return score
    policy = ask.node_policy.value
    by_word = {v.names.common_word: v for v in ask.vendors.vendors}
    for word, allocation in fit.vendors.allocations.items():
        vendor = by_word.get(word)
        if vendor is None:
            continue
        extra = vendor.score_node(node, allocation, devices.gpus, policy)
        if vendor.policy_neutral:
            extra *= -10000 if ask.node_policy is NodePolicy.SPREAD else 10000
        score += extra
    return score


def _prioritize_vendors(ask: PodAsk, hosts: Sequence[str], view: NodeView, fit: NodeFit) -> dict[str, int]:
    """Prioritize for a pod asking only the other vendors: HAMi's node score (`vendor_node_score`) on every
    node the pod fits, turned into kube-scheduler's 0..10 so that HAMi's choice scores highest (binpack:
    the highest HAMi score, spread: the lowest; HAMi sorts the nodes so and takes the last), the others
    in proportion; nodes it does not fit score 0, equal nodes alike."""
    raw: dict[str, float] = {}
    for host in hosts:
        devices = view.vendor_devices(host)
        if devices is None:
            continue
        result = fit(host, view.node_gpus(host))
        if isinstance(result, Fit):
            raw[host] = vendor_node_score(ask, devices, result, view.vendor_node(host))
    scores = {host: 0 for host in hosts}
    if raw:
        low, high = min(raw.values()), max(raw.values())
        spread = ask.node_policy is NodePolicy.SPREAD
        for host, value in raw.items():
            if high == low:
                scores[host] = MAX_SCORE
                continue
            share = (high - value if spread else value - low) / (high - low)
            scores[host] = max(1, round(MAX_SCORE * share))
    return scores


__all__ = [
    "ASK_ANNOTATIONS",
    "NEUTRAL_SCORE",
    "NOT_CACHED",
    "NOT_LEAST_FRAGMENTING",
    "NOT_LEAST_FRAGMENTING_WORD",
    "UNKNOWN_CPU",
    "UNREGISTERED",
    "UNREGISTERED_WORD",
    "CandidateLists",
    "Candidates",
    "ExtenderArgsError",
    "FilterAnswer",
    "HostCPU",
    "NamespaceQuota",
    "NodeFit",
    "NodeView",
    "PodAsk",
    "PrioritizeAnswer",
    "VendorAsk",
    "VendorView",
    "ask_from_requests",
    "cpu_filter_nodes",
    "failure_reason",
    "filter_answer",
    "filter_error",
    "filter_nodes",
    "filter_pod",
    "fit_with_vendors",
    "pass_through",
    "prioritize_answer",
    "prioritize_nodes",
    "prioritize_pod",
    "read_candidates",
    "read_pod_ask",
    "read_vendor_ask",
    "unregistered_reason",
    "zero_scores",
]
