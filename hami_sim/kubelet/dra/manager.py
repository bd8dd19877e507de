"""Kubelet's DRA manager, as a stand-in (kubernetes pkg/kubelet/cm/dra/manager.go, claiminfo.go): it
prepares a pod's ResourceClaims before the pod's containers start, hands the containers their CDI
device IDs, and unprepares a claim when the last pod using it on the node is gone.

Prepare (`prepare_pod`, kubelet's PrepareResources), first a check that changes nothing:

1. each pod claim's ResourceClaim name (`claims.claim_name`); a claim deliberately not created is
   skipped;
2. GET the claim (`fetch ResourceClaim <name>: <err>`); a claim made from a template must be the
   pod's (`... was not created for pod ... (pod is not owner)`); the pod must be in
   `status.reservedFor` (`pod <name> (<uid>) is not allowed to use ResourceClaim <claim> (<uid>)`); it
   must be allocated (`ResourceClaim <name>: not allocated`); every driver of its allocation results
   must have a plugin (`DRA driver <driver> is not registered`);

then:

3. the claim enters the cache (a cached claim of the same name with another UID: `old ResourceClaim
   with same name ... still exists`), the pod's reference is added and the checkpoint written;
4. claims already prepared are skipped; the others go to their drivers' plugins, one
   NodePrepareResources per plugin with all of the pod's claims for it (45 s deadline);
5. an RPC failure (`NodePrepareResources: rpc error: ...`), a claim's error (`NodePrepareResources
   failed for ResourceClaim <name>: <error>`), an answer for a claim not asked about (`... returned
   result for unknown claim UID <uid>`) or a claim missing from the answer (`NodePrepareResources
   skipped <n> ResourceClaims`) fails the pod's start; the pod keeps its references, so a later try
   prepares only what is left, and a pod that goes away unprepares them;
6. the devices of the answer are kept per claim and driver, the claims marked prepared, the checkpoint
   written.

Unprepare (`unprepare_pod`, kubelet's UnprepareResources): for each cached claim the pod references, a
claim other pods still reference only loses the reference; the others are unprepared, one
NodeUnprepareResources per driver, and leave the cache when every call succeeded (errors as for
prepare, with NodeUnprepareResources). A pod that ended (`pod_gone`) is unprepared at once and again
with backoff until it worked; the reconcile loop (60 s) does the same for every referenced pod that is
no longer active (pods that went while the kubelet was down).

After a restart the cache comes back from the checkpoint with no claim marked prepared: the next pod
that uses a claim prepares it again (plugins must be idempotent), as in kubelet.

Deliberate differences: kubelet appends a re-prepared claim's devices to those its checkpoint holds,
so after a restart each is listed twice; the stand-in replaces them. Kubelet finds the claims of a pod
whose checkpoint references are gone from the pod's spec; the stand-in only unprepares what the
checkpoint references.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami_kube.backoff import RetryPolicy
from hami_kube.client import KubeApi
from hami_kube.errors import KubeApiError
from hami_node.ports import ObserverFactory
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.dra import claims as rules
from hami_sim.kubelet.dra.checkpoint import (
    ClaimInfoState,
    DraCheckpointError,
    read_dra_checkpoint,
    write_checkpoint,
)
from hami_sim.kubelet.dra.plugins import (
    ClaimRef,
    DraPlugin,
    DraPluginManager,
    DriverNotRegistered,
    PluginRpcFailed,
    PrepareResult,
    call_prepare,
    call_unprepare,
)
from hami_sim.kubelet.dra.registration import PluginInfo
from hami_sim.kubelet.dra.watcher import PluginWatcher

log = logging.getLogger(__name__)

JSON = Mapping[str, Any]

RESOURCE_CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
PREPARE_PREFIX = "prepare dynamic resources: "
UNPREPARE_PREFIX = "unprepare dynamic resources: "


class PrepareError(Exception):
    """A pod's claims cannot be prepared; the message is kubelet's error without its prefix."""


class UnprepareError(Exception):
    """A pod's claims could not be unprepared; the message is kubelet's error without its prefix."""


@dataclass
class ClaimInfo:
    """A cached claim: the checkpointed state and whether it was prepared since the start."""

    state: ClaimInfoState
    prepared: bool = False


def _meta(obj: JSON) -> JSON:
    return obj.get("metadata") or {}


@dataclass
class _Checked:
    """A claim that passed the validation pass of prepare."""

    name: str
    uid: str
    drivers: list[str]
    plugins: dict[str, DraPlugin]


class DraManager:
    """One node's DRA manager on the caller's loop: `await start()`, `restart()`, `stop()`."""

    def __init__(
        self,
        config: KubeletConfig,
        api: KubeApi | None,
        *,
        observer_factory: ObserverFactory | None = None,
    ) -> None:
        self.config = config
        self._api = api
        self._observer_factory = observer_factory
        self._claims: dict[tuple[str, str], ClaimInfo] = {}
        self._lock = asyncio.Lock()
        self.plugins: DraPluginManager | None = None
        self.watcher: PluginWatcher | None = None
        self._active_pods: Callable[[], Iterable[str] | None] | None = None
        self._reconciler: asyncio.Task[None] | None = None
        self._unprepares: dict[str, asyncio.Task[None]] = {}
        self._rng = random.Random()
        self._retry = RetryPolicy(initial=config.prepare_retry_initial, maximum=config.prepare_retry_max)
        self._changed: asyncio.Condition | None = None

    # ------------------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Load the checkpoint (a bad one stops the start, as it stops kubelet), wipe the node's
        ResourceSlices, watch the registration directory, start the reconcile loop."""
        self._changed = asyncio.Condition()
        self._load_checkpoint()
        await self._start_plugins()

    async def _start_plugins(self) -> None:
        plugins = DraPluginManager(
            self.config.node_name,
            self._api,
            wiping_delay=self.config.dra_wiping_delay,
            call_timeout=self.config.dra_call_timeout,
            on_change=self._notify,
        )
        self.plugins = plugins
        plugins.start()
        self.watcher = PluginWatcher(
            self.config.registry_dir,
            self._register,
            self._deregister,
            observer_factory=self._observer_factory,
            dial_timeout=self.config.dial_timeout,
            name=self.config.node_name,
        )
        await self.watcher.start()
        self._reconciler = asyncio.create_task(
            self._reconcile_loop(), name=f"dra-reconcile-{self.config.node_name}"
        )

    async def stop(self) -> None:
        tasks = [t for t in (self._reconciler, *self._unprepares.values()) if t is not None]
        self._reconciler = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._unprepares.clear()
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            await watcher.stop()
        plugins, self.plugins = self.plugins, None
        if plugins is not None:
            await plugins.stop()

    async def restart(self) -> None:
        """A kubelet restart: plugins forgotten and registered again from their sockets, the claim
        cache read back from the checkpoint (nothing prepared), the node's slices wiped again."""
        await self.stop()
        self._claims.clear()
        self._load_checkpoint()
        await self._start_plugins()
        self._notify()

    def _load_checkpoint(self) -> None:
        path = self.config.dra_checkpoint_path
        if not path.exists():
            write_checkpoint(path, None)  # GetOrCreate stores an empty checkpoint
            return
        try:
            entries = read_dra_checkpoint(path)
        except DraCheckpointError as exc:
            raise DraCheckpointError(
                f"{exc}; could not initialize the DRA checkpoint, please drain the node and remove {path}"
            ) from None
        self._claims = {e.key: ClaimInfo(e) for e in entries}

    def _write_checkpoint(self) -> None:
        try:
            write_checkpoint(self.config.dra_checkpoint_path, [c.state for c in self._claims.values()])
        except OSError as exc:
            log.error("node %s: cannot write the DRA checkpoint: %s", self.config.node_name, exc)

    def set_active_pods(self, active_pods: Callable[[], Iterable[str] | None]) -> None:
        """Where the reconcile loop learns the active pods' UIDs (None until the first pod list)."""
        self._active_pods = active_pods

    # ------------------------------------------------------------------------------ registration

    async def _register(self, info: PluginInfo, service: str) -> None:
        if self.plugins is not None:
            self.plugins.add(info.driver, info.endpoint, service)

    async def _deregister(self, driver: str, endpoint: str) -> None:
        if self.plugins is not None:
            await self.plugins.remove(driver, endpoint)

    # ------------------------------------------------------------------------------ changes

    def _notify(self) -> None:
        condition = self._changed
        if condition is None:
            return

        async def wake() -> None:
            async with condition:
                condition.notify_all()

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(wake())

    async def wait_for(self, predicate: Callable[[DraManager], bool], seconds: float) -> None:
        """Wait until `predicate(self)` holds (re-checked after every plugin or claim change)."""
        condition = self._changed
        if condition is None:
            raise RuntimeError("the DRA manager is not started")
        async with condition:
            await asyncio.wait_for(condition.wait_for(lambda: predicate(self)), seconds)

    # ------------------------------------------------------------------------------ views

    def claims(self) -> dict[tuple[str, str], ClaimInfo]:
        """The claim cache: (namespace, claim name) -> ClaimInfo."""
        return dict(self._claims)

    def pod_might_need_to_unprepare(self, pod_uid: str) -> bool:
        """PodMightNeedToUnprepareResources: a cached claim still references the pod (kubelet holds
        the pod's deletion until this is false)."""
        return any(pod_uid in c.state.pod_uids for c in self._claims.values())

    def container_cdi_ids(self, pod: JSON, container: JSON) -> list[str]:
        """GetResources: the CDI device IDs for the container; raises `claims.ClaimError`."""
        return rules.container_cdi_device_ids(pod, container, {k: c.state for k, c in self._claims.items()})

    def container_claims(self, pod: JSON, container: JSON) -> list[ClaimInfoState]:
        """GetContainerClaimInfos, for the PodResources API: the cached claims the container uses
        ([] when one is missing, as kubelet logs and answers nothing)."""
        namespace = str(_meta(pod).get("namespace") or "")
        result = []
        try:
            for name, _ in rules.container_claim_requests(pod, container):
                info = self._claims.get((namespace, name))
                if info is None:
                    return []
                result.append(info.state)
        except rules.ClaimError:
            return []
        return result

    # ------------------------------------------------------------------------------ prepare

    async def prepare_pod(self, pod: JSON) -> None:
        """PrepareResources (see the module docstring); raises `PrepareError`."""
        async with self._lock:
            try:
                await self._prepare(pod)
            finally:
                self._notify()

    async def _check(self, pod: JSON) -> list[_Checked]:
        """The validation pass: nothing changes when it fails."""
        namespace = str(_meta(pod).get("namespace") or "")
        checked: list[_Checked] = []
        for pod_claim in rules.pod_claims(pod):
            try:
                name, must_check_owner = rules.claim_name(pod, pod_claim)
            except rules.ClaimError as exc:
                raise PrepareError(str(exc)) from None
            if name is None:
                continue
            claim = await self._get_claim(namespace, name)
            try:
                if must_check_owner:
                    rules.check_owner(pod, claim)
            except rules.ClaimError as exc:
                raise PrepareError(str(exc)) from None
            if not rules.is_reserved_for_pod(pod, claim):
                raise PrepareError(rules.not_reserved_message(pod, name, claim))
            try:
                drivers = rules.allocation_drivers(claim)
            except rules.ClaimError as exc:
                raise PrepareError(f"ResourceClaim {name}: {exc}") from None
            plugins: dict[str, DraPlugin] = {}
            for driver in drivers:
                try:
                    plugins[driver] = self._plugin(driver)
                except DriverNotRegistered as exc:
                    raise PrepareError(str(exc)) from None
            checked.append(_Checked(name, str(_meta(claim).get("uid") or ""), drivers, plugins))
        return checked

    async def _get_claim(self, namespace: str, name: str) -> JSON:
        if self._api is None:
            raise PrepareError(f"fetch ResourceClaim {name}: the kubelet stand-in has no API server")
        try:
            return await self._api.get(RESOURCE_CLAIMS.format(namespace=namespace, name=name))
        except KubeApiError as exc:
            raise PrepareError(f"fetch ResourceClaim {name}: {exc.message or exc}") from None

    def _plugin(self, driver: str) -> DraPlugin:
        if self.plugins is None:
            raise DriverNotRegistered(f"DRA driver {driver} is not registered")
        return self.plugins.get(driver)

    async def _prepare(self, pod: JSON) -> None:
        meta = _meta(pod)
        namespace, pod_uid = str(meta.get("namespace") or ""), str(meta.get("uid") or "")
        checked = await self._check(pod)
        batches: dict[DraPlugin, list[ClaimRef]] = {}
        pending: dict[str, tuple[str, str]] = {}
        try:
            for claim in checked:
                key = (namespace, claim.name)
                info = self._claims.get(key)
                if info is None:
                    state = ClaimInfoState(
                        claim.uid, claim.name, namespace, set(), {d: () for d in claim.drivers}
                    )
                    info = self._claims[key] = ClaimInfo(state)
                elif info.state.claim_uid != claim.uid:
                    raise PrepareError(
                        f"old ResourceClaim with same name {claim.name} and different UID "
                        f"{info.state.claim_uid} still exists (previous pod force-deleted?!)"
                    )
                info.state.pod_uids.add(pod_uid)
                if info.prepared:
                    continue
                pending[claim.uid] = key
                ref = ClaimRef(namespace, claim.uid, claim.name)
                for driver in claim.drivers:
                    batches.setdefault(claim.plugins[driver], []).append(ref)
        finally:
            self._write_checkpoint()
        for plugin, refs in batches.items():
            try:
                results = await call_prepare(plugin, refs)
            except PluginRpcFailed as exc:
                raise PrepareError(str(exc)) from None
            self._take_results(plugin.driver, refs, results, pending)
        for key in pending.values():
            if key in self._claims:
                self._claims[key].prepared = True
        self._write_checkpoint()
        log.info(
            "node %s: prepared %d claim(s) of pod %s/%s",
            self.config.node_name,
            len(pending),
            namespace,
            meta.get("name"),
        )

    def _take_results(
        self,
        driver: str,
        refs: list[ClaimRef],
        results: Mapping[str, PrepareResult],
        pending: Mapping[str, tuple[str, str]],
    ) -> None:
        by_uid = {r.uid: r for r in refs}
        for uid, result in results.items():
            ref = by_uid.get(uid)
            if ref is None:
                raise PrepareError(f"NodePrepareResources returned result for unknown claim UID {uid}")
            if result.error:
                raise PrepareError(
                    f"NodePrepareResources failed for ResourceClaim {ref.name}: {result.error}"
                )
            info = self._claims.get(pending[uid])
            if info is None:
                raise PrepareError(
                    f"internal error: unable to get claim info for ResourceClaim {ref.name} in namespace "
                    f"{ref.namespace}"
                )
            info.state.driver_state[driver] = result.devices
        unfinished = len(refs) - len(results)
        if unfinished:
            raise PrepareError(f"NodePrepareResources skipped {unfinished} ResourceClaims")

    # ------------------------------------------------------------------------------ unprepare

    async def unprepare_pod(self, pod_uid: str) -> None:
        """UnprepareResources for the claims the pod references; raises `UnprepareError`."""
        async with self._lock:
            try:
                await self._unprepare(pod_uid)
            finally:
                self._notify()

    async def _unprepare(self, pod_uid: str) -> None:
        batches: dict[str, list[ClaimRef]] = {}
        last: list[tuple[str, str]] = []
        dropped = False
        for key, info in self._claims.items():
            state = info.state
            if pod_uid not in state.pod_uids:
                continue
            if len(state.pod_uids) > 1:
                state.pod_uids.discard(pod_uid)
                dropped = True
                continue
            last.append(key)
            for driver in state.driver_state:
                batches.setdefault(driver, []).append(
                    ClaimRef(state.namespace, state.claim_uid, state.claim_name)
                )
        for driver, refs in batches.items():
            try:
                plugin = self._plugin(driver)
            except DriverNotRegistered as exc:
                raise UnprepareError(str(exc)) from None
            try:
                results = await call_unprepare(plugin, refs)
            except PluginRpcFailed as exc:
                raise UnprepareError(str(exc)) from None
            by_uid = {r.uid: r for r in refs}
            for uid, error in results.items():
                ref = by_uid.get(uid)
                if ref is None:
                    raise UnprepareError(
                        f"NodeUnprepareResources returned result for unknown claim UID {uid}"
                    )
                if error:
                    raise UnprepareError(
                        f"NodeUnprepareResources failed for ResourceClaim {ref.name}: {error}"
                    )
            unfinished = len(refs) - len(results)
            if unfinished:
                raise UnprepareError(f"NodeUnprepareResources skipped {unfinished} ResourceClaims")
        for key in last:
            self._claims.pop(key, None)
        if last or dropped:
            self._write_checkpoint()
        if last:
            log.info("node %s: unprepared %d claim(s) of pod %s", self.config.node_name, len(last), pod_uid)

    def pod_gone(self, pod_uid: str) -> None:
        """The pod ended or was deleted: unprepare its claims now, and with backoff until it worked."""
        if pod_uid in self._unprepares or not self.pod_might_need_to_unprepare(pod_uid):
            return
        task = asyncio.get_running_loop().create_task(
            self._unprepare_until_done(pod_uid), name=f"dra-unprepare-{self.config.node_name}"
        )
        self._unprepares[pod_uid] = task

    async def _unprepare_until_done(self, pod_uid: str) -> None:
        try:
            failures = 0
            while self.pod_might_need_to_unprepare(pod_uid):
                try:
                    await self.unprepare_pod(pod_uid)
                except UnprepareError as exc:
                    failures += 1
                    delay = self._retry.delay(failures, self._rng)
                    log.warning(
                        "node %s: %s%s (pod %s; retry in %.1f s)",
                        self.config.node_name,
                        UNPREPARE_PREFIX,
                        exc,
                        pod_uid,
                        delay,
                    )
                    await asyncio.sleep(delay)
        finally:
            if self._unprepares.get(pod_uid) is asyncio.current_task():
                del self._unprepares[pod_uid]

    async def _reconcile_loop(self) -> None:
        """reconcileLoop every `dra_reconcile_period`: unprepare the claims of pods no longer active
        (once the pod list has been read)."""
        while True:
            await asyncio.sleep(self.config.dra_reconcile_period)
            self.reconcile()

    def reconcile(self) -> None:
        source = self._active_pods
        active = None if source is None else source()
        if active is None:
            return
        keep = set(active)
        referenced = {uid for c in self._claims.values() for uid in c.state.pod_uids}
        for pod_uid in sorted(referenced - keep):
            self.pod_gone(pod_uid)
