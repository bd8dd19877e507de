"""A model of the bind/Allocate protocol, for the explicit-state checker in `protocol_check`.

The pending window, the annotations on the Binding and the node daemon's lookup at Allocate form a
small distributed protocol between the control plane, the API server, kubelet and the node daemon. This
module states it as a transition system: every component's state is a frozen value, every step one
component can take is an action, and the checker explores every interleaving of them.

**Components and where each action is in the code**

- *API server* (`State.api`, one `Pod` per pod: node, GPUs of `hami.io/vgpu-devices-to-allocate`,
  `hami.io/bind-phase`, phase, reason; None once deleted). Every change is queued, in order, on each
  watch that shows that pod (`_set_pod`): the control plane sees every pod, a node's kubelet and node
  daemon the pods bound to that node (`spec.nodeName` field selector). A queued change is delivered
  whenever the checker chooses (`deliver ...`): each consumer sees the API's changes in order, but
  late. Binding requests in flight are `State.requests`; the API server serves them in any order
  (`api-bind`), answering 409 when the pod is already bound or gone; with `Config.lost_answers` a
  Binding may be committed with its answer lost, or dropped unhandled without an answer.
- *Control plane* (`Binder`, `hami_control/binder.py` and `pod_store.py`):
  `bind-start` is kube-scheduler calling `/bind` for a pod the API shows unbound, on a node where the
  extender's filter fits it (`Binder.bind` -> `_reserve`: a pod already in a window is refused; a pod
  whose GPU counts meet a pending pod's on the node waits, `_obstacle`); `bind-wake` is a waiting bind
  woken by a window release (`_wake`); the reservation (`_reserve` after its last await: fit on the
  watch-fed cache, `PodStore.assume`, `PendingWindow.enter`) is atomic, and sends the Binding
  (`_write`); `bind-answer` is the API's answer reaching `_write` (a refusal rolls back: `_rollback`
  forgets the assumption and releases the window; an error whose outcome is unknown keeps both,
  `_keep`, for the watch or the sweep; a 409 naming the same node is success, `_landed`).
  `deliver control` is one pod event reaching `PodStore.apply` (the allocation it shows replaces the
  assumption, `_confirm`; a deletion, a terminal phase or another node drops it) and then
  `Binder.pod_event` (bind-phase success/failed, deletion or a terminal phase releases the window).
  `restart control` loses every bind in flight, the window and the assumptions, and relists
  (`ClusterCaches` resync); with `Config.election` the new leader adopts the pods still allocating
  into the windows (`main._start_election` -> `Binder.adopt_allocating`).
  Timeouts: `wait-timeout` (`bind_wait_s`), `sweep-window` and `expire-assumption` (`Binder.sweep`,
  `allocate_timeout_s`).
- *kubelet* (`Kubelet`, `hami_sim/kubelet/pods.py` `PodAdmitter`, `devicemanager.py`): `kubelet-admit`
  takes a pod bound to its node that it has not admitted (`_work`, in creation order by default), asks
  the device plugin's GetPreferredAllocation, chooses its devices (`_devices_to_allocate`: the preferred
  ones when free, else the first free) and calls Allocate; `kubelet-record` writes the checkpoint
  (`_allocate_resource` -> `_write_checkpoint`) and the pod's status (Running, or Failed with
  `UnexpectedAdmissionError` when Allocate failed or no device was free). `restart kubelet` loses the
  admission in progress, keeps the checkpoint (`_load_checkpoint`) and relists: Running pods keep their
  devices, Pending ones are admitted again, reusing checkpointed devices without a call.
- *node daemon* (`Daemon`, `hami_node/pods.py` `PodTracker`, `hami_node/allocation.py`,
  `hami_node/plugin/server.py`): its view of the pods bound to its node comes from its watch
  (`PodTracker.pod_event`); at Allocate it looks up the one waiting pod (phase Pending, bind-phase
  allocating, not finished by it) whose container asks that many GPUs (`match_pending_pod`; two is
  `AmbiguousPodError`), confirms each match with a GET of the pod (`_confirm`: one the API shows no
  longer waiting is dropped from its view), on a miss reads the node's pods once (`_read_node_pods`),
  checks kubelet's devices against the pod's GPUs (`grant_container`) and queues bind-phase success or failed
  (`allocated` / `failed` -> `_finish`); with `Config.identify` it reads kubelet's PodResources list
  first and takes only a pod kubelet lists without devices (`_kubelet_listed`: the pod it admits, and
  the ones it rejected, as a kubelet before 1.29 lists them), and the control plane lets pods with
  equal GPU counts be pending on the node together; `daemon-send` is its writer thread sending the head of the
  queue (`_write_loop` -> `_send`). `restart daemon` loses the queue, the finished and deleted sets and
  relists.

**Abstractions.** Every pod has one container asking `PodSpec.gpus` whole GPUs; every GPU holds one
container (capacity 1, split count 1), so kubelet's device IDs are the GPUs themselves. Fitting is
first-fit over the node's GPUs in order (a deterministic choice; which GPUs does not matter to the
protocol). GetPreferredAllocation and Allocate of one admission are one step. Timeouts are longer than
every normal step: a timeout action is enabled only in states where no progress action is (that is the
timing assumption the code's defaults make: `allocate_timeout_s` 30 s against a node daemon's answer
in milliseconds). Faults (restarts, deletions, a Binding committed whose answer is lost) may happen in
any state, each within its budget.

**Properties** (`violations`, `done`): no GPU holds more than its capacity as the API records
allocations, nor as a kubelet's checkpoint records devices; every checkpointed container's GPUs are its
pod's annotation GPUs; the node daemon never answers kubelet's Allocate for one pod with another pod
(recorded by the transition, `State.wrong`); in a final state (nothing but faults enabled) no pod is
stuck in bind-phase allocating and no window entry or assumption outlives its pod; and (liveness,
checked by `protocol_check`) from every state a state is reachable where every pod is settled: Running
with its bind-phase answered, Failed with a reason, deleted, or unbound because no node has room for it
(by the API's allocations).

`Config.identify` checks the protocol of nodes whose daemon reads kubelet's PodResources list
(hami_node/plugin/kubelet_pods.py). `Config` has switches for mutated protocols (`window_rule=False`:
pods with equal GPU counts pending together; `assume_before_await=False`: the assumption made only once
the Binding is answered), used by the tests to show the checker catches those bugs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

_T = TypeVar("_T")
_E = TypeVar("_E", bound=tuple[Any, ...])

ALLOCATING = "allocating"
SUCCESS = "success"
FAILED = "failed"
PENDING = "Pending"
RUNNING = "Running"
FAILED_PHASE = "Failed"
ADMISSION_ERROR = "UnexpectedAdmissionError"

PROGRESS, FAULT, TIMEOUT = "progress", "fault", "timeout"


# --- configuration ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    gpus: int
    """Whole GPUs its one container asks for (`nvidia.com/gpu`)."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[str, ...]
    """Its GPUs (capacity one container each), in fitting order."""


@dataclass(frozen=True, slots=True)
class Config:
    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...]
    """In creation order (kubelet admits in that order)."""
    restarts: frozenset[str] = frozenset()
    """Components that may restart once: "control", "kubelet/<node>", "daemon/<node>"."""
    deletable: frozenset[str] = frozenset()
    """Pods a user may delete (once) at any time."""
    lost_answers: int = 0
    """Bindings the API server may commit while the control plane gets no answer (a timeout, a reset)."""
    election: bool = True
    """A restarted control plane adopts the pods still allocating (`Binder.adopt_allocating`): what a new
    leader does with `--leader-elect`. Without election nothing adopts them."""
    kubelet_any_order: bool = False
    """kubelet may admit its pending pods in any order (default: creation order, as the stand-in)."""
    force_delete: bool = False
    """Deletions remove a bound pod at once (`kubectl delete --force --grace-period=0`) instead of
    setting its deletionTimestamp and letting its kubelet remove it."""
    recover_lost_success: bool = True
    """The node daemon patches bind-phase success for a pod it sees Running but still allocating
    (`hami_node.pods.lost_success`). False: as the code was before that fix."""
    adopt_from_watch: bool = True
    """The control plane enters a pod its watch shows newly allocating into its node's window
    (`Binder.pod_event`). False: as the code was before that fix."""
    keep_unknown_outcome: bool = True
    """A Binding answered with an error whose outcome is unknown (no answer, a 5xx, a timeout) keeps the
    assumption and the window entry for the watch or the sweep (`Binder._keep`); only a refusal rolls
    back. False: as the code was before that fix (every error rolled back)."""
    confirm_match: bool = True
    """The node daemon confirms a match from its watch with a GET of the pod (`PodTracker._confirm`): one
    the API shows gone, being deleted, ended or no longer allocating is dropped from its view and the
    lookup repeats. False: as the code was before that fix."""
    identify: bool = False
    """Every node daemon reads kubelet's PodResources list at Allocate (`PodTracker` with `kubelet`,
    hami_node/plugin/kubelet_pods.py): a match must be a pod kubelet lists without devices (the pod it
    admits; also, as kubelets before 1.29 list terminal pods, the ones it rejected), and the control
    plane lets pods with equal GPU counts be pending on such a node together (`Binder._obstacle`,
    `identifies`)."""
    window_rule: bool = True
    """Mutation switch: False lets pods with equal GPU counts be pending on one node together."""
    assume_before_await: bool = True
    """Mutation switch: False assumes the pod only once the Binding is answered."""
    node_index: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"Config.nodes: duplicate node names {names}")
        gpus = [g for n in self.nodes for g in n.gpus]
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"Config.nodes: duplicate GPU names {gpus}")
        pods = [p.name for p in self.pods]
        if len(set(pods)) != len(pods):
            raise ValueError(f"Config.pods: duplicate pod names {pods}")
        for pod in self.pods:
            if pod.gpus < 1:
                raise ValueError(f"Config.pods: pod {pod.name} asks {pod.gpus} GPUs, expected >= 1")
        components = {"control"} | {f"{kind}/{n}" for kind in ("kubelet", "daemon") for n in names}
        if not self.restarts <= components:
            raise ValueError(f"Config.restarts: unknown components {sorted(self.restarts - components)}")
        if not self.deletable <= set(pods):
            raise ValueError(f"Config.deletable: unknown pods {sorted(self.deletable - set(pods))}")
        object.__setattr__(self, "node_index", {n: i for i, n in enumerate(names)})


def small_config(**changes: Any) -> Config:
    """The configuration the tests check: 2 nodes (n1 with two GPUs, n2 with one), 3 pods (a and b ask 1
    GPU each, c asks 2: equal counts for the window's rule, more asked than there is room); `changes`
    adds faults (restarts, deletions, lost answers) or switches (`Config` fields)."""
    nodes = (NodeSpec("n1", ("g1", "g2")), NodeSpec("n2", ("g3",)))
    pods = (PodSpec("a", 1), PodSpec("b", 1), PodSpec("c", 2))
    return replace(Config(nodes, pods), **changes)


# --- state ------------------------------------------------------------------------------------------------


class Pod(NamedTuple):
    """The API server's record of a pod (what the protocol reads of it)."""

    node: str = ""
    gpus: tuple[str, ...] = ()
    """`hami.io/vgpu-devices-to-allocate` (and `-allocated`), as GPUs."""
    bind_phase: str = ""
    phase: str = PENDING
    deleting: bool = False
    """`metadata.deletionTimestamp` set: kubelet stops it, then removes it."""

    @property
    def terminal(self) -> bool:
        return self.phase == FAILED_PHASE


View = tuple[Pod | None, ...]
"""Per pod (by index): what a component's watch has shown of it (None: nothing, or deleted)."""
Event = tuple[int, Pod | None]
"""A watch event: the pod's index and its new state (None: deleted)."""


class Task(NamedTuple):
    """A `/bind` call in progress in the control plane."""

    stage: str
    """"wait" (for the window), "sent" (Binding written, no answer yet), "answer" (answer arrived)."""
    node: str
    gpus: tuple[str, ...] = ()
    result: str = ""
    """"ok", "rejected" (409/404) or "error" (no answer)."""


class Request(NamedTuple):
    """A Binding the API server has received and not served yet."""

    pod: int
    node: str
    gpus: tuple[str, ...]


class Binder(NamedTuple):
    view: View
    chan: tuple[Event, ...]
    window: frozenset[tuple[int, str]]
    """(pod, node) pending entries."""
    assumed: frozenset[tuple[int, str, tuple[str, ...]]]
    tasks: tuple[Task | None, ...]


Checkpoint = frozenset[tuple[int, tuple[str, ...]]]
"""(pod, devices) pairs."""


class Kubelet(NamedTuple):
    view: View
    chan: tuple[Event, ...]
    seen: frozenset[int]
    """Pods it has admitted or rejected (never admitted again, until a restart)."""
    admitting: tuple[int, tuple[str, ...], str] | None
    """(pod, devices, `ADMISSION_ERROR` or "") between the Allocate answer and the checkpoint/status."""
    checkpoint: Checkpoint
    """(pod, devices) of `kubelet_internal_checkpoint`: survives restarts."""


class Daemon(NamedTuple):
    view: View
    chan: tuple[Event, ...]
    finished: frozenset[int]
    deleted: frozenset[int]
    writes: tuple[tuple[int, str], ...]
    """bind-phase patches queued, in order."""


class State(NamedTuple):
    api: tuple[Pod | None, ...]
    requests: tuple[Request, ...]
    binder: Binder
    kubelets: tuple[Kubelet, ...]
    daemons: tuple[Daemon, ...]
    restarts: frozenset[str]
    deletable: frozenset[int]
    lost_answers: int
    wrong: str = ""
    """Set by a transition that breaks "the daemon answers Allocate for the pod kubelet admits"."""


_Fanout = tuple[Event | None, tuple[tuple[int, Event], ...], tuple[tuple[int, Event], ...]]
"""A pod change's events: the control plane's (None: none), (node index, event) for kubelets, for
node daemons."""


def _for_control(pod: Pod | None) -> Pod | None:
    """What the control plane reads of a pod: not whether it runs or is being deleted, only whether it
    ended (`PodRecord.terminal`)."""
    if pod is None or (pod.phase != RUNNING and not pod.deleting):
        return pod
    return pod._replace(phase=FAILED_PHASE if pod.terminal else PENDING, deleting=False)


def _for_kubelet(pod: Pod | None) -> Pod | None:
    """What kubelet reads of a pod bound to it: that it is there, whether it is being deleted, and
    whether it ended."""
    if pod is None:
        return None
    return Pod(node=pod.node, phase=FAILED_PHASE if pod.terminal else PENDING, deleting=pod.deleting)


def _allocating(pod: Pod | None) -> bool:
    return pod is not None and bool(pod.node) and not pod.terminal and pod.bind_phase == ALLOCATING


def _put(seq: tuple[_T, ...], index: int, value: _T) -> tuple[_T, ...]:
    return (*seq[:index], value, *seq[index + 1 :])


def _without(entries: frozenset[_E], pod: int) -> frozenset[_E]:
    """`entries` (window entries or assumptions) less the ones of `pod`: the same set when it has none
    (a frozenset keeps its hash, and states are hashed at every step)."""
    if not any(e[0] == pod for e in entries):
        return entries
    return frozenset(e for e in entries if e[0] != pod)


# The model builds a new state per transition, hundreds of thousands per check: these are
# `state._replace(...)` for the fields its steps change most, at half the cost.


def _with_binder(state: State, binder: Binder) -> State:
    api, requests, _, kubelets, daemons, restarts, deletable, lost_answers, wrong = state
    return State(api, requests, binder, kubelets, daemons, restarts, deletable, lost_answers, wrong)


def _with_kubelet(state: State, k: int, kubelet: Kubelet) -> State:
    api, requests, binder, kubelets, daemons, restarts, deletable, lost_answers, wrong = state
    kubelets = _put(kubelets, k, kubelet)
    return State(api, requests, binder, kubelets, daemons, restarts, deletable, lost_answers, wrong)


def _with_daemon(state: State, k: int, daemon: Daemon) -> State:
    api, requests, binder, kubelets, daemons, restarts, deletable, lost_answers, wrong = state
    daemons = _put(daemons, k, daemon)
    return State(api, requests, binder, kubelets, daemons, restarts, deletable, lost_answers, wrong)


def _with_tasks(binder: Binder, pod: int, task: Task | None) -> Binder:
    view, chan, window, assumed, tasks = binder
    return Binder(view, chan, window, assumed, _put(tasks, pod, task))


# --- the model --------------------------------------------------------------------------------------------


class ProtocolModel:
    """The transition system of the protocol under `config` (a `protocol_check.TransitionSystem`).

    A check builds hundreds of thousands of states from a few thousand distinct values of each component:
    what is a function of one component (its steps, the properties of the API's pods) is memoized, and
    a step rebuilds only the parts of the state it changes."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.counts = tuple(p.gpus for p in config.pods)
        self.names = tuple(p.name for p in config.pods)
        self.node_names = tuple(n.name for n in config.nodes)
        self._last: tuple[State, list[tuple[str, str, State]]] | None = None
        # Memos of what is a function of one part of a state (a component's steps, the properties, the
        # events of a pod's change): a check meets a few dozen to a few thousand distinct values of each
        # part, each in up to hundreds of thousands of states. Per node for kubelets and daemons.
        self._control_memo: dict[Binder, list[tuple[str, Binder, Request | None]]] = {}
        self._kubelet_delivery_memo: tuple[dict[Kubelet, tuple[str, Kubelet]], ...] = tuple(
            {} for _ in config.nodes
        )
        self._kubelet_work_memo: tuple[dict[Kubelet, tuple[tuple[int, ...], tuple[int, ...]]], ...] = tuple(
            {} for _ in config.nodes
        )
        self._daemon_delivery_memo: tuple[dict[Daemon, tuple[str, Daemon]], ...] = tuple(
            {} for _ in config.nodes
        )
        self._fanout_memo: dict[tuple[int, Pod | None, Pod | None], _Fanout] = {}
        self._capacity_memo: dict[
            tuple[tuple[Pod | None, ...], tuple[Checkpoint, ...]], list[tuple[str, str]]
        ] = {}
        self._done_memo: dict[tuple[Pod | None, ...], bool] = {}

    # -- helpers ---------------------------------------------------------------------------------------

    def initial(self) -> State:
        n_pods, n_nodes = len(self.config.pods), len(self.config.nodes)
        api: tuple[Pod | None, ...] = tuple(Pod() for _ in range(n_pods))
        empty: View = (None,) * n_pods
        binder = Binder(api, (), frozenset(), frozenset(), (None,) * n_pods)
        kubelet = Kubelet(empty, (), frozenset(), None, frozenset())
        daemon = Daemon(empty, (), frozenset(), frozenset(), ())
        deletable = frozenset(i for i, name in enumerate(self.names) if name in self.config.deletable)
        return State(
            api,
            (),
            binder,
            (kubelet,) * n_nodes,
            (daemon,) * n_nodes,
            self.config.restarts,
            deletable,
            self.config.lost_answers,
        )

    def _set_pod(self, state: State, index: int, new: Pod | None) -> State:
        """Change the API's pod and queue the change on every watch that shows it (`_fanout`)."""
        api, requests, binder, kubelets, daemons, restarts, deletable, lost_answers, wrong = state
        control, to_kubelets, to_daemons = self._fanout(index, api[index], new)
        if control is not None:
            view, chan, window, assumed, tasks = binder
            binder = Binder(view, (*chan, control), window, assumed, tasks)
        for k, event in to_kubelets:
            view, chan, seen, admitting, checkpoint = kubelets[k]
            kubelets = _put(kubelets, k, Kubelet(view, (*chan, event), seen, admitting, checkpoint))
        for k, event in to_daemons:
            view, chan, finished, deleted, writes = daemons[k]
            daemons = _put(daemons, k, Daemon(view, (*chan, event), finished, deleted, writes))
        api = _put(api, index, new)
        return State(api, requests, binder, kubelets, daemons, restarts, deletable, lost_answers, wrong)

    def _fanout(self, index: int, old: Pod | None, new: Pod | None) -> _Fanout:
        """The events a change of pod `index` from `old` to `new` queues on each watch that shows it
        (the control plane's; each node's kubelet's and daemon's, by node index), as each consumer reads
        it (`_for_control`, `_for_kubelet`): a change a consumer cannot tell from the previous state is
        not queued for it (delivering it would change nothing). Memoized."""
        key = (index, old, new)
        known = self._fanout_memo.get(key)
        if known is not None:
            return known
        seen = _for_control(new)
        control = (index, seen) if seen != _for_control(old) else None
        to_kubelets: list[tuple[int, Event]] = []
        to_daemons: list[tuple[int, Event]] = []
        for k, node in enumerate(self.node_names):
            mine_new = new if new is not None and new.node == node else None
            mine_old = old if old is not None and old.node == node else None
            if mine_new is None and mine_old is None:
                continue
            kubelet_new = _for_kubelet(mine_new)
            if kubelet_new != _for_kubelet(mine_old):
                to_kubelets.append((k, (index, kubelet_new)))
            if mine_new != mine_old:
                to_daemons.append((k, (index, mine_new)))
        known = self._fanout_memo[key] = (control, tuple(to_kubelets), tuple(to_daemons))
        return known

    def _node_view(self, state: State, node: str) -> View:
        return tuple(p if p is not None and p.node == node else None for p in state.api)

    @staticmethod
    def _held(binder: Binder) -> dict[int, tuple[str, tuple[str, ...]]]:
        """What the control plane's GPU cache counts per pod (`PodStore._settle`): the watched
        allocation, else the assumption."""
        held: dict[int, tuple[str, tuple[str, ...]]] = {}
        for pod, node, gpus in binder.assumed:
            held[pod] = (node, gpus)
        for i, seen in enumerate(binder.view):
            if seen is not None and seen.node and seen.gpus and not seen.terminal:
                held[i] = (seen.node, seen.gpus)
        return held

    def _fit(self, used: set[str], pod: int, k: int) -> tuple[str, ...] | None:
        """First fit of `pod` on node `k` (by index) beside the GPUs in `used`."""
        free = [g for g in self.config.nodes[k].gpus if g not in used]
        need = self.counts[pod]
        return tuple(free[:need]) if len(free) >= need else None

    def _cache_used(self, binder: Binder) -> set[str]:
        """The GPUs the control plane's cache counts as used."""
        return {g for _, (_, gpus) in self._held(binder).items() for g in gpus}

    def _api_used(self, api: tuple[Pod | None, ...]) -> set[str]:
        return {g for p in api if p is not None and p.node and not p.terminal for g in p.gpus}

    def _blocked(self, binder: Binder, pod: int, node: str) -> bool:
        """`Binder._obstacle`: a pod pending on `node` asks the same GPU count (never, with the window's
        rule switched off)."""
        if not self.config.window_rule or self.config.identify:
            return False
        return any(n == node and q != pod and self.counts[q] == self.counts[pod] for q, n in binder.window)

    def _assume(self, binder: Binder, pod: int, node: str, gpus: tuple[str, ...]) -> Binder:
        """`PodStore.assume`: not when the watch already shows the pod's allocation."""
        seen = binder.view[pod]
        if seen is not None and seen.gpus and seen.node and not seen.terminal:
            return binder
        kept = frozenset(a for a in binder.assumed if a[0] != pod)
        return binder._replace(assumed=kept | {(pod, node, gpus)})

    @staticmethod
    def _forget(binder: Binder, pod: int) -> Binder:
        return binder._replace(assumed=_without(binder.assumed, pod))

    @staticmethod
    def _release(binder: Binder, pod: int) -> Binder:
        return binder._replace(window=_without(binder.window, pod))

    # -- the control plane -----------------------------------------------------------------------------

    def _reserve(
        self, binder: Binder, pod: int, node: str, gpus: tuple[str, ...] | None
    ) -> tuple[Binder, Request | None]:
        """`Binder._reserve` after its last await (`gpus`: its fit on the watch-fed cache), then
        `_write` sending the Binding (None: the pod does not fit, nothing sent)."""
        if gpus is None:  # no_fit: the bind fails, kube-scheduler retries later
            return _with_tasks(binder, pod, None), None
        if self.config.assume_before_await:
            binder = self._assume(binder, pod, node, gpus)
        binder = binder._replace(
            window=frozenset(w for w in binder.window if w[0] != pod) | {(pod, node)},
            tasks=_put(binder.tasks, pod, Task("sent", node, gpus)),
        )
        return binder, Request(pod, node, gpus)

    def _control(self, state: State) -> Iterator[tuple[str, str, State]]:
        """Its progress actions (`_control_steps`); its timeouts are `_timeouts`."""
        for label, binder, request in self._control_steps(state.binder):
            if request is None:
                yield PROGRESS, label, _with_binder(state, binder)
            else:
                requests = tuple(sorted((*state.requests, request)))
                yield PROGRESS, label, state._replace(binder=binder, requests=requests)

    def _control_steps(self, binder: Binder) -> list[tuple[str, Binder, Request | None]]:
        """(label, control plane after it, Binding it sends) of each of its progress actions: a function
        of its own state, memoized (a check meets a few thousand control plane states, each in many
        states of the whole)."""
        known = self._control_memo.get(binder)
        if known is None:
            known = self._control_memo[binder] = list(self._steps_of_control(binder))
        return known

    def _steps_of_control(self, binder: Binder) -> Iterator[tuple[str, Binder, Request | None]]:
        used = self._cache_used(binder)
        for pod, task in enumerate(binder.tasks):
            name = self.names[pod]
            if task is None:
                # kube-scheduler's informer lags like ours: it may retry a pod the API already bound
                seen = binder.view[pod]
                if seen is None or seen.node or seen.terminal or any(w[0] == pod for w in binder.window):
                    continue
                for k, node in enumerate(self.node_names):
                    gpus = self._fit(used, pod, k)
                    if gpus is None:
                        continue
                    label = f"bind-start {name} -> {node}"
                    if self._blocked(binder, pod, node):
                        yield label + " (waits)", _with_tasks(binder, pod, Task("wait", node)), None
                    else:
                        yield (label, *self._reserve(binder, pod, node, gpus))
            elif task.stage == "wait":
                if not self._blocked(binder, pod, task.node):
                    gpus = self._fit(used, pod, self.config.node_index[task.node])
                    yield (f"bind-wake {name}", *self._reserve(binder, pod, task.node, gpus))
            elif task.stage == "answer":
                yield f"bind-answer {name} ({task.result})", self._answer(binder, pod, task), None
        if binder.chan:
            yield f"deliver control {self._event_text(binder.chan[0])}", self._deliver_control(binder), None

    def _timeouts(self, state: State) -> Iterator[tuple[str, str, State]]:
        """The control plane's timeouts (`actions` lists them only where no progress action is enabled):
        waits given up, by pod, then window entries swept, then assumptions expired."""
        binder = state.binder
        for pod, task in enumerate(binder.tasks):
            if task is not None and task.stage == "wait" and self._blocked(binder, pod, task.node):
                waited = _with_tasks(binder, pod, None)
                yield TIMEOUT, f"wait-timeout {self.names[pod]}", _with_binder(state, waited)
        for pod, where in sorted(binder.window):
            released = self._release(binder, pod)
            yield TIMEOUT, f"sweep-window {self.names[pod]} on {where}", _with_binder(state, released)
        for pod, _, _ in sorted(binder.assumed):
            forgotten = self._forget(binder, pod)
            yield TIMEOUT, f"expire-assumption {self.names[pod]}", _with_binder(state, forgotten)

    def _answer(self, binder: Binder, pod: int, task: Task) -> Binder:
        binder = _with_tasks(binder, pod, None)
        if task.result == "ok":
            if not self.config.assume_before_await:
                binder = self._assume(binder, pod, task.node, task.gpus)
        elif task.result == "rejected" or not self.config.keep_unknown_outcome:  # `_rollback`
            binder = self._release(self._forget(binder, pod), pod)
        # "error" (outcome unknown): `_keep`, the watch or the sweep settles it
        return binder

    def _deliver_control(self, binder: Binder) -> Binder:
        """One event through `PodStore.apply` / `_deleted` and `Binder.pod_event`."""
        view, chan, window, assumed, tasks = binder
        (pod, new), rest = chan[0], chan[1:]
        old = view[pod]
        if new is None or new.terminal or (new.node and new.gpus):
            assumed = _without(assumed, pod)
        if new is None or new.terminal or new.bind_phase in (SUCCESS, FAILED):
            window = _without(window, pod)
        if (
            self.config.adopt_from_watch
            and _allocating(new)
            and not (_allocating(old) and old is not None and new is not None and old.node == new.node)
            and not any(w[0] == pod for w in window)
        ):
            assert new is not None
            window = window | {(pod, new.node)}
        return Binder(_put(view, pod, new), rest, window, assumed, tasks)

    def _restarts_control(self, state: State) -> Iterator[State]:
        """The control plane dies and comes back: each Binding it had sent is served by the API server or
        dropped before the new process lists (the timing assumption: a dead client's request is served
        within the seconds a restart takes); then the new process relists, its window and assumptions
        empty, adopting the pods still allocating (`Config.election`: the new leader's
        `adopt_allocating`; `Config.adopt_from_watch`: `Binder.pod_event` on the first list)."""
        outcomes: list[State] = [state._replace(requests=())]
        for request in state.requests:
            served: list[State] = []
            for base in outcomes:
                served.append(base)
                pod = base.api[request.pod]
                if pod is not None and not pod.node and not pod.terminal:
                    bound = pod._replace(node=request.node, gpus=request.gpus, bind_phase=ALLOCATING)
                    served.append(self._set_pod(base, request.pod, bound))
            outcomes = served
        n_pods = len(self.names)
        for after in outcomes:
            window: frozenset[tuple[int, str]] = frozenset()
            if self.config.election or self.config.adopt_from_watch:
                window = frozenset(
                    (i, p.node)
                    for i, p in enumerate(after.api)
                    if p is not None and p.node and not p.terminal and p.bind_phase == ALLOCATING
                )
            view = tuple(_for_control(p) for p in after.api)
            yield after._replace(binder=Binder(view, (), window, frozenset(), (None,) * n_pods))

    # -- the API server --------------------------------------------------------------------------------

    def _api(self, state: State) -> Iterator[tuple[str, str, State]]:
        for i, request in enumerate(state.requests):
            name = self.names[request.pod]
            rest = state.requests[:i] + state.requests[i + 1 :]
            pod = state.api[request.pod]
            commits = pod is not None and not pod.node and not pod.terminal
            base = state._replace(requests=rest)
            if state.lost_answers > 0:  # dropped before the API server handled it: no answer either
                dropped = self._answered(base._replace(lost_answers=state.lost_answers - 1), request, "error")
                yield FAULT, f"api-bind {name} -> {request.node} (dropped, no answer)", dropped
            if commits:
                assert pod is not None
                bound = pod._replace(node=request.node, gpus=request.gpus, bind_phase=ALLOCATING)
                base = self._set_pod(base, request.pod, bound)
            # 409 naming this very node: the pod's own Binding landed before (`binder._landed`)
            landed = pod is not None and pod.node == request.node and not pod.terminal
            result = "ok" if commits or landed else "rejected"
            yield (
                PROGRESS,
                f"api-bind {name} -> {request.node} ({result})",
                self._answered(base, request, result),
            )
            if commits and state.lost_answers > 0:
                lost = self._answered(base._replace(lost_answers=state.lost_answers - 1), request, "error")
                yield FAULT, f"api-bind {name} -> {request.node} (committed, answer lost)", lost

    def _answered(self, state: State, request: Request, result: str) -> State:
        """The API's answer reaches the `/bind` call that sent it, if that call is still there. An "ok"
        answer changes nothing but ending the call when the pod was assumed before the await, so it
        ends the call at once (one interleaving less, none lost: the API already shows the pod bound,
        so nothing else can start a bind of it)."""
        task = state.binder.tasks[request.pod]
        if task is None or task.stage != "sent":
            return state
        if result == "ok" and self.config.assume_before_await:
            answered = None
        else:
            answered = task._replace(stage="answer", result=result)
        return _with_binder(state, _with_tasks(state.binder, request.pod, answered))

    # -- kubelet ---------------------------------------------------------------------------------------

    def _kubelet(self, state: State, k: int) -> Iterator[tuple[str, str, State]]:
        node = self.node_names[k]
        kubelet = state.kubelets[k]
        if kubelet.chan:
            label, delivered = self._deliver_kubelet(k, kubelet)
            yield PROGRESS, label, _with_kubelet(state, k, delivered)
        if kubelet.admitting is not None:
            yield (
                PROGRESS,
                f"kubelet-record {node} {self.names[kubelet.admitting[0]]}",
                self._record(state, k),
            )
            return
        removes, admits = self._work(k, kubelet)
        for pod in removes:
            yield PROGRESS, f"kubelet-remove {node} {self.names[pod]}", self._remove(state, k, pod)
        for pod in admits:
            yield from self._admit(state, k, pod)

    def _work(self, k: int, kubelet: Kubelet) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(pods to remove, pods it may admit next) of an idle kubelet (memoized)."""
        known = self._kubelet_work_memo[k].get(kubelet)
        if known is None:
            # being deleted: kubelet stops it, frees its devices, removes it
            removes = tuple(i for i, p in enumerate(kubelet.view) if p is not None and p.deleting)
            waiting = tuple(
                i
                for i, p in enumerate(kubelet.view)
                if p is not None and p.phase == PENDING and not p.deleting and i not in kubelet.seen
            )
            admits = waiting if self.config.kubelet_any_order else waiting[:1]
            known = self._kubelet_work_memo[k][kubelet] = (removes, admits)
        return known

    def _admit(self, state: State, k: int, pod: int) -> Iterator[tuple[str, str, State]]:
        node = self.config.nodes[k]
        kubelet = state.kubelets[k]
        kubelet = kubelet._replace(seen=kubelet.seen | {pod})
        label = f"kubelet-admit {node.name} {self.names[pod]}"
        kept = next((d for p, d in kubelet.checkpoint if p == pod), None)
        if kept is not None:  # admitted before a restart: its devices come from the checkpoint
            kubelet = kubelet._replace(admitting=(pod, kept, ""))
            yield PROGRESS, label + " (checkpointed devices)", _with_kubelet(state, k, kubelet)
            return
        used = {g for _, devices in kubelet.checkpoint for g in devices}
        free = [g for g in node.gpus if g not in used]
        need = self.counts[pod]
        if len(free) < need:
            kubelet = kubelet._replace(admitting=(pod, (), ADMISSION_ERROR))
            yield PROGRESS, label + " (no free device)", _with_kubelet(state, k, kubelet)
            return
        daemon = state.daemons[k]
        listed = self._kubelet_listed(kubelet, pod) if self.config.identify else None
        daemon, steer, _ = self._lookup(state, k, daemon, need, listed)  # GetPreferredAllocation's steering
        steered = daemon.view[steer] if steer is not None else None
        preferred = steered.gpus if steered is not None else ()
        devices = preferred if preferred and set(preferred) <= set(free) else tuple(free[:need])
        daemon, match, error = self._lookup(state, k, daemon, need, listed)
        wrong = state.wrong
        if match is None:
            reason = ADMISSION_ERROR
        else:
            granted = daemon.view[match]
            assert granted is not None
            if set(devices) == set(granted.gpus):
                reason = ""
                write = SUCCESS
            else:
                reason = ADMISSION_ERROR
                error = f"devices {devices} are not pod {self.names[match]}'s {granted.gpus}"
                write = FAILED
            daemon = daemon._replace(
                finished=daemon.finished | {match}, writes=(*daemon.writes, (match, write))
            )
            if match != pod and not wrong:
                wrong = (
                    f"daemon/{node.name} answered kubelet's Allocate for pod {self.names[pod]} with pod "
                    f"{self.names[match]} (GPUs {granted.gpus}, bind-phase {write})"
                )
        kubelet = kubelet._replace(admitting=(pod, devices, reason))
        daemons = _put(state.daemons, k, daemon)
        nxt = _with_kubelet(state, k, kubelet)._replace(daemons=daemons, wrong=wrong)
        yield PROGRESS, label + f" -> {devices}" + (f" (fails: {error})" if reason else ""), nxt

    @staticmethod
    def _kubelet_listed(kubelet: Kubelet, pod: int) -> frozenset[int]:
        """What kubelet's PodResources List shows without devices while it admits `pod`: `pod` itself
        (in its pod manager, its devices recorded only once Allocate answered), and, as a kubelet before
        1.29 lists every pod of its pod manager, the pods it handled before that hold no devices (those
        it rejected; a restart's relist keeps them). Pods it has not handled yet are not listed."""
        held = {p for p, _ in kubelet.checkpoint}
        return frozenset({pod} | {i for i in kubelet.seen if i not in held and kubelet.view[i] is not None})

    def _record(self, state: State, k: int) -> State:
        view, chan, seen, admitting, checkpoint = state.kubelets[k]
        assert admitting is not None
        pod, devices, reason = admitting
        if not reason and view[pod] is not None:
            checkpoint = checkpoint | {(pod, devices)}
        state = _with_kubelet(state, k, Kubelet(view, chan, seen, None, checkpoint))
        current = state.api[pod]
        if current is None or current.phase != PENDING:
            return state
        if reason:
            return self._set_pod(state, pod, current._replace(phase=FAILED_PHASE))
        return self._set_pod(state, pod, current._replace(phase=RUNNING))

    def _remove(self, state: State, k: int, pod: int) -> State:
        kubelet = state.kubelets[k]
        kubelet = kubelet._replace(checkpoint=frozenset(c for c in kubelet.checkpoint if c[0] != pod))
        state = _with_kubelet(state, k, kubelet)
        return self._set_pod(state, pod, None) if state.api[pod] is not None else state

    def _deliver_kubelet(self, k: int, kubelet: Kubelet) -> tuple[str, Kubelet]:
        """One event through `PodAdmitter` (memoized)."""
        known = self._kubelet_delivery_memo[k].get(kubelet)
        if known is None:
            view, chan, seen, admitting, checkpoint = kubelet
            (pod, new), rest = chan[0], chan[1:]
            if new is None or new.terminal:  # `PodAdmitter._end`: its devices are freed
                checkpoint = _without(checkpoint, pod)
            label = f"deliver kubelet/{self.node_names[k]} {self._event_text(chan[0])}"
            delivered = Kubelet(_put(view, pod, new), rest, seen, admitting, checkpoint)
            known = self._kubelet_delivery_memo[k][kubelet] = (label, delivered)
        return known

    def _restart_kubelet(self, state: State, k: int) -> State:
        listed = self._node_view(state, self.node_names[k])
        seen = frozenset(i for i, p in enumerate(listed) if p is not None and p.phase != PENDING)
        alive = {i for i, p in enumerate(listed) if p is not None and not p.terminal}
        view = tuple(_for_kubelet(p) for p in listed)
        checkpoint = frozenset(c for c in state.kubelets[k].checkpoint if c[0] in alive)
        return _with_kubelet(state, k, Kubelet(view, (), seen, None, checkpoint))

    # -- the node daemon -------------------------------------------------------------------------------

    @staticmethod
    def _waiting(daemon: Daemon) -> list[int]:
        """`waiting_pod` over the daemon's view, less the pods it finished."""
        return [
            i
            for i, p in enumerate(daemon.view)
            if p is not None
            and p.phase == PENDING
            and not p.deleting
            and p.bind_phase == ALLOCATING
            and p.gpus
            and i not in daemon.finished
        ]

    def _lookup(
        self, state: State, k: int, daemon: Daemon, count: int, listed: frozenset[int] | None = None
    ) -> tuple[Daemon, int | None, str]:
        """`PodTracker._match`: the one waiting pod asking `count` GPUs (with `listed`, kubelet's
        PodResources list: one it lists without devices, `_resolve` with `kubelet`), each match
        confirmed by a GET (`_confirm`, `Config.confirm_match`); on a miss, one read of the node's pods
        (`_read_node_pods`) and a second try."""
        node = self.node_names[k]

        def candidates(daemon: Daemon) -> list[int]:
            return [
                i
                for i in self._waiting(daemon)
                if self.counts[i] == count and (listed is None or i in listed)
            ]

        for attempt in range(2):
            matches = candidates(daemon)
            stale = [i for i in matches if not self._still_waiting(state, node, i)]
            while self.config.confirm_match and stale:  # dropped: what the GET showed replaces it
                view = list(daemon.view)
                for i in stale:
                    current = state.api[i]
                    view[i] = current if current is not None and current.node == node else None
                gone = {i for i in stale if state.api[i] is None}
                daemon = daemon._replace(view=tuple(view), deleted=daemon.deleted | gone)
                matches = candidates(daemon)
                stale = [i for i in matches if not self._still_waiting(state, node, i)]
            if len(matches) > 1:
                names = ", ".join(self.names[i] for i in matches)
                return daemon, None, f"AmbiguousPodError ({names})"
            if matches:
                return daemon, matches[0], ""
            if attempt == 0:
                known = set(self._waiting(daemon))
                view = list(daemon.view)
                for i, p in enumerate(state.api):
                    if (
                        i not in known
                        and i not in daemon.deleted
                        and i not in daemon.finished
                        and self._still_waiting(state, node, i)
                    ):
                        view[i] = p
                daemon = daemon._replace(view=tuple(view))
        return daemon, None, f"no pod pending on node with {count} GPU(s)"

    @staticmethod
    def _still_waiting(state: State, node: str, pod: int) -> bool:
        """`waiting_pod` over the API's copy of the pod."""
        p = state.api[pod]
        return (
            p is not None
            and p.node == node
            and p.phase == PENDING
            and not p.deleting
            and p.bind_phase == ALLOCATING
            and bool(p.gpus)
        )

    def _daemon(self, state: State, k: int) -> Iterator[tuple[str, str, State]]:
        node = self.node_names[k]
        daemon = state.daemons[k]
        view, chan, finished, deleted, writes = daemon
        if chan:
            label, delivered = self._deliver_daemon(k, daemon)
            yield PROGRESS, label, _with_daemon(state, k, delivered)
        if writes:
            (pod, phase), rest_writes = writes[0], writes[1:]
            nxt = _with_daemon(state, k, Daemon(view, chan, finished, deleted, rest_writes))
            current = state.api[pod]
            if current is not None:
                nxt = self._set_pod(nxt, pod, current._replace(bind_phase=phase))
            yield PROGRESS, f"daemon-send {node} {self.names[pod]} bind-phase={phase}", nxt

    def _deliver_daemon(self, k: int, daemon: Daemon) -> tuple[str, Daemon]:
        """One event through `PodTracker.pod_event` (memoized)."""
        known = self._daemon_delivery_memo[k].get(daemon)
        if known is None:
            view, chan, finished, deleted, writes = daemon
            (pod, new), rest = chan[0], chan[1:]
            if new is None:
                deleted = deleted | {pod}
            label = f"deliver daemon/{self.node_names[k]} {self._event_text(chan[0])}"
            delivered = self._recover(Daemon(_put(view, pod, new), rest, finished, deleted, writes), pod)
            known = self._daemon_delivery_memo[k][daemon] = (label, delivered)
        return known

    def _recover(self, daemon: Daemon, pod: int) -> Daemon:
        """`PodTracker._observe` -> `_recover_success`: a pod it sees Running and still allocating
        gets its success patch (once)."""
        seen = daemon.view[pod]
        if (
            not self.config.recover_lost_success
            or pod in daemon.finished
            or seen is None
            or seen.phase != RUNNING
            or seen.deleting
            or seen.bind_phase != ALLOCATING
        ):
            return daemon
        return daemon._replace(finished=daemon.finished | {pod}, writes=(*daemon.writes, (pod, SUCCESS)))

    def _restart_daemon(self, state: State, k: int) -> State:
        view = self._node_view(state, self.node_names[k])
        daemon = Daemon(view, (), frozenset(), frozenset(), ())
        for pod in range(len(view)):
            daemon = self._recover(daemon, pod)
        return _with_daemon(state, k, daemon)

    # -- faults ----------------------------------------------------------------------------------------

    def _faults(self, state: State) -> Iterator[tuple[str, str, State]]:
        for component in sorted(state.restarts):
            left = state._replace(restarts=state.restarts - {component})
            if component == "control":
                for after in self._restarts_control(left):
                    bound = [self.names[r.pod] for r in left.requests if after.api[r.pod] != left.api[r.pod]]
                    served = (
                        f" (Bindings in flight served: {', '.join(bound) or 'none'})" if left.requests else ""
                    )
                    yield FAULT, "restart control" + served, after
                continue
            kind, node = component.split("/")
            k = self.config.node_index[node]
            restart = self._restart_kubelet if kind == "kubelet" else self._restart_daemon
            yield FAULT, f"restart {component}", restart(left, k)
        for pod in sorted(state.deletable):
            current = state.api[pod]
            if current is not None:
                gone = state._replace(deletable=state.deletable - {pod})
                if current.node and not self.config.force_delete:
                    yield (
                        FAULT,
                        f"delete {self.names[pod]}",
                        self._set_pod(gone, pod, current._replace(deleting=True)),
                    )
                else:
                    yield FAULT, f"delete {self.names[pod]} (removed at once)", self._set_pod(gone, pod, None)

    # -- the transition system -------------------------------------------------------------------------

    def actions(self, state: State) -> list[tuple[str, str, State]]:
        """(kind, label, next state) of every action enabled in `state`, timeouts only when no progress
        action is enabled."""
        if self._last is not None and self._last[0] is state:
            return self._last[1]
        found = list(self._control(state))
        found.extend(self._api(state))
        for k in range(len(self.node_names)):
            found.extend(self._kubelet(state, k))
            found.extend(self._daemon(state, k))
        found.extend(self._faults(state))
        if all(kind != PROGRESS for kind, _, _ in found):
            # where no progress is possible the control plane enables nothing else, and the API server
            # (nothing in flight) nothing at all: its timeouts come first, as it lists them
            found[:0] = self._timeouts(state)
        self._last = (state, found)
        return found

    def successors(self, state: State) -> Iterable[tuple[str, State]]:
        return [(label, nxt) for _, label, nxt in self.actions(state) if nxt is not state]

    def final(self, state: State) -> bool:
        """Nothing but faults can happen."""
        return all(kind == FAULT for kind, _, _ in self.actions(state))

    def violations(self, state: State) -> Iterator[tuple[str, str]]:
        if state.wrong:
            yield "wrong-pod", state.wrong
        yield from self._capacity(state.api, tuple([kubelet.checkpoint for kubelet in state.kubelets]))
        if self.final(state):
            yield from self._final_violations(state)

    def _capacity(
        self, api: tuple[Pod | None, ...], checkpoints: tuple[Checkpoint, ...]
    ) -> list[tuple[str, str]]:
        """The violations of GPU capacity (by the API's allocations, by each kubelet's checkpoint) and of
        checkpointed devices against annotations: a function of the API's pods and the checkpoints,
        memoized (a check meets a few thousand of those, each in many states)."""
        key = (api, checkpoints)
        known = self._capacity_memo.get(key)
        if known is None:
            known = self._capacity_memo[key] = list(self._capacity_violations(api, checkpoints))
        return known

    def _capacity_violations(
        self, api: tuple[Pod | None, ...], checkpoints: tuple[Checkpoint, ...]
    ) -> Iterator[tuple[str, str]]:
        holders: dict[str, list[str]] = {}
        for i, p in enumerate(api):
            if p is not None and p.node and not p.terminal:
                for g in p.gpus:
                    holders.setdefault(g, []).append(self.names[i])
        for gpu, pods in sorted(holders.items()):
            if len(pods) > 1:
                yield (
                    "gpu-capacity-api",
                    f"GPU {gpu} is allocated to pods {', '.join(pods)} by their annotations",
                )
        for node, checkpoint in zip(self.node_names, checkpoints, strict=True):
            devices: dict[str, list[str]] = {}
            for pod, ids in sorted(checkpoint):
                for g in ids:
                    devices.setdefault(g, []).append(self.names[pod])
                annotated = api[pod]
                if annotated is not None and set(ids) != set(annotated.gpus):
                    yield (
                        "device-annotation",
                        f"kubelet/{node} checkpoints pod {self.names[pod]} on {ids}, its annotation says "
                        f"{annotated.gpus}",
                    )
            for gpu, pods in sorted(devices.items()):
                if len(pods) > 1:
                    yield (
                        "gpu-capacity-kubelet",
                        f"kubelet/{node} checkpoints GPU {gpu} for {', '.join(pods)}",
                    )

    def _final_violations(self, state: State) -> Iterator[tuple[str, str]]:
        for i, p in enumerate(state.api):
            if p is not None and p.bind_phase == ALLOCATING and not p.terminal:
                yield (
                    "stuck-allocating",
                    f"pod {self.names[i]} ({p.phase}) keeps bind-phase allocating for ever",
                )
        for pod, node in sorted(state.binder.window):
            if state.api[pod] is None:
                yield "window-outlives-pod", f"window entry of deleted pod {self.names[pod]} on {node}"
        for pod, node, _ in sorted(state.binder.assumed):
            if state.api[pod] is None:
                yield "assumption-outlives-pod", f"assumption of deleted pod {self.names[pod]} on {node}"

    def done(self, state: State) -> bool:
        """Every pod settled: Running with its bind-phase answered, Failed, deleted, or unbound because no
        node has room for it by the API's allocations (memoized by the API's pods)."""
        known = self._done_memo.get(state.api)
        if known is None:
            known = self._done_memo[state.api] = self._settled(state.api)
        return known

    def _settled(self, api: tuple[Pod | None, ...]) -> bool:
        used = self._api_used(api)
        for i, p in enumerate(api):
            if p is None or p.terminal:
                continue
            if p.phase == RUNNING and p.bind_phase != ALLOCATING:
                continue
            if not p.node and all(self._fit(used, i, k) is None for k in range(len(self.node_names))):
                continue
            return False
        return True

    def _event_text(self, event: Event) -> str:
        pod, new = event
        if new is None:
            return f"{self.names[pod]} deleted"
        parts = [f"node={new.node or '-'}", f"bind-phase={new.bind_phase or '-'}", f"phase={new.phase}"]
        if new.deleting:
            parts.append("deleting")
        return f"{self.names[pod]} {' '.join(parts)}"


__all__ = [
    "Config",
    "NodeSpec",
    "PodSpec",
    "ProtocolModel",
    "State",
    "small_config",
]
