"""Per-pod scheduling-cycle state for the extender, after kube-scheduler's CycleState (data a PreFilter
computes once per pod and cycle, read by Filter, Score and Bind; kubernetes
`pkg/scheduler/framework/cycle_state.go`). kube-scheduler calls `/filter`, then (when more than one node
is left) `/prioritize`, then `/bind` for the pod it is scheduling; what those verbs would each read or
compute again is kept here once:

- the pod's GPU ask (`extender.PodAsk`, without its quota check, which is taken fresh per request) and
  what the pod counts against its own namespace's quota, read by the first verb of the cycle;
- the GPU choice (`fit.Fit`) made for each node evaluated one by one (`Choice`), with the node's
  `ClusterCache.generation` and the quota check it was made under: a later verb takes it instead of
  fitting again only while both are unchanged, so the answer is the one a fresh fit would give.

Keyed by pod uid and valid for one resourceVersion: a request showing another resourceVersion reads the
pod again, and keeps the choices only if the ask read is the same. Bounded: the `max_pods` most recently
used cycles (least recently used dropped first); a cycle keeps every choice of its filter only until its
prioritize (or until another pod's cycle starts), then the `max_choices` best scored.

The GPU table path (`gputable`: one container asking GPUs, most pods) decides every node at once
without a per-node choice, so its cycles carry the ask only and `/bind` fits the one node it is given
(computing a choice for the best nodes at prioritize would cost the same fits, sooner, and be wasted
whenever kube-scheduler's own scores pick another node).
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hami_control.extender import NodeFit, PodAsk, VendorView, fit_with_vendors
from hami_control.fit import Fit, FitResult, QuotaCheck
from hami_control.quota import QuotaUsage
from hami_control.usage import NodeGPUs

_ZERO = QuotaUsage()


@dataclass(frozen=True, slots=True)
class Choice:
    """The GPUs chosen for a pod on one node, on the node's `generation`, under the quota check `quota`."""

    fit: Fit
    generation: int
    quota: QuotaCheck | None


class PodCycle:
    """One pod's cycle: its ask as read (None: it asks no GPU), its own quota usage, and its choices."""

    __slots__ = ("ask", "choices", "own", "resource_version", "uid")

    def __init__(self, uid: str, resource_version: str, ask: PodAsk | None, own: QuotaUsage) -> None:
        self.uid = uid
        self.resource_version = resource_version
        self.ask = ask
        self.own = own
        self.choices: dict[str, Choice] = {}

    def choice(self, node: str, quota: QuotaCheck | None) -> Choice | None:
        """The choice made for `node` under an equal quota check (the binder checks the generation)."""
        choice = self.choices.get(node)
        return choice if choice is not None and choice.quota == quota else None

    def fitter(
        self,
        ask: PodAsk,
        generation: Callable[[str], int],
        vendors: VendorView | None = None,
    ) -> NodeFit:
        """`extender.NodeFit` for `ask` (this cycle's ask under the request's quota check): a node's
        choice is reused while its generation and the check are those it was made with; new fits are
        kept. `vendors`: the cluster's other-vendor devices (and their pods), for a pod that asks some
        (their changes change the generation too)."""
        choices = self.choices
        if ask.vendors is None:
            vendors = None

        def fit(name: str, node: NodeGPUs | None) -> FitResult:
            current = generation(name)
            kept = choices.get(name)
            if kept is not None and kept.generation == current and kept.quota == ask.quota:
                return kept.fit
            result = ask.fit(node) if vendors is None else fit_with_vendors(ask, vendors, name, node)
            if isinstance(result, Fit):
                choices[name] = Choice(result, current, ask.quota)
            elif kept is not None:
                del choices[name]
            return result

        return fit


def pod_identity(pod: object) -> tuple[str, str]:
    """(uid, resourceVersion) of a pod in a request, "" for what is missing."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return "", ""
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    return (uid if isinstance(uid, str) else "", version if isinstance(version, str) else "")


class CycleStates:
    """The recent pods' cycles by uid (see the module docstring). Single event loop, not thread-safe."""

    def __init__(self, max_pods: int = 1024, max_choices: int = 8) -> None:
        if max_pods < 1 or max_choices < 1:
            raise ValueError(f"max_pods and max_choices must be >= 1: {max_pods}, {max_choices}")
        self.max_pods = max_pods
        self.max_choices = max_choices
        self._cycles: collections.OrderedDict[str, PodCycle] = collections.OrderedDict()
        self._latest: PodCycle | None = None
        """The cycle used last: the only one that may keep more than `max_choices` choices."""

    def __len__(self) -> int:
        return len(self._cycles)

    def get(self, uid: str) -> PodCycle | None:
        cycle = self._cycles.get(uid)
        if cycle is not None:
            self._cycles.move_to_end(uid)
            self._use(cycle)
        return cycle

    def start(self, uid: str, resource_version: str, ask: PodAsk | None, own: QuotaUsage = _ZERO) -> PodCycle:
        """A new cycle for the pod (replacing its old one); kept only when `uid` is not empty."""
        cycle = PodCycle(uid, resource_version, ask, own)
        self._use(cycle)
        if uid:
            self._cycles[uid] = cycle
            self._cycles.move_to_end(uid)
            while len(self._cycles) > self.max_pods:
                self._cycles.popitem(last=False)
        return cycle

    def _use(self, cycle: PodCycle) -> None:
        latest, self._latest = self._latest, cycle
        if latest is not None and latest is not cycle and len(latest.choices) > self.max_choices:
            latest.choices.clear()  # never prioritized: which node will be bound is anyone's guess

    def scored(self, cycle: PodCycle, hosts: Iterable[str], scores: Iterable[int]) -> None:
        """After prioritize (`scores[i]` of `hosts[i]`): keep the choices of the `max_choices` best scored
        nodes only."""
        if len(cycle.choices) <= self.max_choices:
            return
        choices = cycle.choices
        best = heapq.nlargest(
            self.max_choices,
            ((int(score), host) for host, score in zip(hosts, scores, strict=True) if host in choices),
        )
        keep = {host for _, host in best}
        for host in [h for h in cycle.choices if h not in keep]:
            del cycle.choices[host]


__all__ = ["Choice", "CycleStates", "PodCycle", "pod_identity"]
