"""Node and GPU scores, HAMi's formulas (pkg/scheduler/policy: `ComputeDefaultScore`, `ComputeScore`), pure.

Node score (Prioritize): HAMi computes `10 x (sum Used/sum Count + sum Usedcores/sum Totalcore +
sum Usedmem/sum Totalmem)` over the node's GPUs, 0..30, and binpack prefers the highest, spread the
lowest. Here it is divided by 3 to land in kube-scheduler's extender range 0..10, and for spread it is
turned around (`10 - x`), so that for both policies a higher score is a better node.

GPU score (the binpack/spread order of a node's GPUs): `10 x (wSlot (1+Used)/Count + wCore
(reqCores+Usedcores)/Totalcore + wMem (reqMem+Usedmem)/Totalmem)` with the weights of
`hami.io/device-scoring-weights`.

Deviation from HAMi, on purpose: HAMi counts the request's own terms only when the request's type
string equals the device's type string. For NVIDIA the request says "NVIDIA" and the device the model
name ("NVIDIA-Tesla V100-PCIE-32GB"), so they never match and HAMi scores current usage only; two GPUs
with the same usage but different sizes then tie although the request fills one much more. Here the
request always counts: in the GPU score as above, and in the node score as the pod's chosen slices
(the node as it would be with the pod placed).

Fragmentation (ours, not HAMi's; `hami_control.frag`): the node score is how little the node's expected
fragmentation for the task mix grows with the pod placed, relative to what the pod takes:
`5 x (1 - growth / pod's milli-GPUs)` clamped to 0..10, so a pod that fills exactly a fragment scores 10,
one that leaves the fragmentation as it was 5, and one that fragments as much as it takes 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from hami_api.resources import ContainerRequest
from hami_api.types import GPUSlice, NodePolicy, ScoringWeights
from hami_control.frag import DEFAULT_MIX, TaskMix, node_fragmentation, node_free
from hami_control.usage import GPUUsage, NodeGPUs, with_slices

MAX_SCORE = 10
"""kube-scheduler's MaxExtenderPriority."""

DEFAULT_WEIGHTS = ScoringWeights()


def _ratio(used: int, total: int) -> float:
    """used/total clamped to 0..1; a dimension the GPUs do not have (total 0) counts as 0."""
    if total <= 0:
        return 0.0
    return min(max(used / total, 0.0), 1.0)


def node_usage(node: NodeGPUs) -> float:
    """HAMi's node usage (ComputeDefaultScore) over all the node's GPUs, unhealthy ones and their slices
    included as HAMi counts them, scaled to 0..10 (0 idle, 10 full)."""
    gpus = node.gpus
    slots = _ratio(sum(g.used for g in gpus), sum(g.info.count for g in gpus))
    cores = _ratio(sum(g.usedcores for g in gpus), sum(g.info.devcore for g in gpus))
    mem = _ratio(sum(g.usedmem for g in gpus), sum(g.info.devmem for g in gpus))
    return MAX_SCORE * (slots + cores + mem) / 3


def fragmentation_score(node: NodeGPUs, pod_slices: Iterable[GPUSlice], mix: TaskMix = DEFAULT_MIX) -> float:
    """0..10, higher is better: how little the node's fragmentation for `mix` grows with the pod's slices
    placed, relative to the milli-GPUs they take (see the module note)."""
    after = with_slices(node, pod_slices)
    taken = int(node_free(node).sum() - node_free(after).sum())
    return growth_score(node_fragmentation(after, mix) - node_fragmentation(node, mix), taken)


def growth_score(growth: float, taken: int) -> float:
    """`5 x (1 - growth / taken)` clamped to 0..10 (growth rounded to 1e-6 milli-GPUs first, so sums in a
    different order cannot tip a score across a rounding boundary)."""
    score = MAX_SCORE / 2 * (1 - round(growth, 6) / max(taken, 1))
    return min(max(score, 0.0), float(MAX_SCORE))


def node_score(
    node: NodeGPUs, pod_slices: Iterable[GPUSlice], policy: NodePolicy, mix: TaskMix = DEFAULT_MIX
) -> float:
    """0..10, higher is better for `policy`: the node's usage with the pod's slices placed (binpack),
    or 10 minus it (spread), or the `fragmentation_score` for `mix`. Pass the pod's peak slices
    (`usage.peak_slices`) of its fit on this node."""
    if policy is NodePolicy.FRAGMENTATION:
        return fragmentation_score(node, pod_slices, mix)
    usage = node_usage(with_slices(node, pod_slices))
    score = usage if policy is NodePolicy.BINPACK else MAX_SCORE - usage
    return min(max(score, 0.0), float(MAX_SCORE))


def node_priority(
    node: NodeGPUs, pod_slices: Iterable[GPUSlice], policy: NodePolicy, mix: TaskMix = DEFAULT_MIX
) -> int:
    """`node_score` rounded to the whole number kube-scheduler's HostPriority carries."""
    return round(node_score(node, pod_slices, policy, mix))


def gpu_score(
    gpu: GPUUsage, request: ContainerRequest | None = None, weights: ScoringWeights = DEFAULT_WEIGHTS
) -> float:
    """HAMi's per-GPU score with the request's own terms counted (see the module note): how full the
    GPU would be with one more slice of `request`. 0 .. 10 x (sum of weights) on a GPU that can take it."""
    slot = 1 if request is not None else 0
    cores = request.coresreq if request is not None else 0
    mem = request.memory_on(gpu.info.devmem) if request is not None else 0
    info = gpu.info
    return 10 * (
        weights.slot * _ratio(slot + gpu.used, info.count)
        + weights.core * _ratio(cores + gpu.usedcores, info.devcore)
        + weights.memory * _ratio(mem + gpu.usedmem, info.devmem)
    )


__all__ = [
    "MAX_SCORE",
    "fragmentation_score",
    "gpu_score",
    "growth_score",
    "node_priority",
    "node_score",
    "node_usage",
]
