"""Lease-based leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it
(k8s.io/client-go/tools/leaderelection/leaderelection.go `tryAcquireOrRenew`, `acquire`, `renew`):

- A candidate reads the Lease. It takes it when there is none (create), when it already holds it, or when
  the holder's record has not changed for `lease_duration_s` as measured on this process's own clock
  from the moment it last saw the record change (client-go's observedTime: never the Lease's own
  timestamps, so clock skew between machines does not matter), or when the holder is empty (released).
- Taking and renewing are updates with the Lease's resourceVersion (optimistic concurrency): of two
  candidates that try at once, one gets 409 Conflict and keeps waiting. Taking it from another holder
  counts one more `leaseTransitions` and sets `acquireTime`.
- The candidate tries every `retry_period_s` (with jitter, as client-go's JitterFactor 1.2) until it leads;
  the leader renews every `retry_period_s` and steps down when no renewal succeeded for
  `renew_deadline_s`.
- `release()` hands the Lease back (holder emptied, 1 s duration) as client-go's ReleaseOnCancel, so a
  follower takes over at once.

Times in the Lease are RFC 3339 with microseconds (MicroTime), as client-go writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hami_kube.client import JSONDict, KubeApi
from hami_kube.errors import KubeApiError

log = logging.getLogger(__name__)

JITTER = 1.2
"""client-go's JitterFactor for the candidate's retries: a wait of retry_period x (1 + up to 1.2)."""


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election: the identity must not be empty")
        if not self.lease_duration_s > self.renew_deadline_s > JITTER * self.retry_period_s > 0:
            raise ValueError(
                "leader election: need lease duration > renew deadline > 1.2 x retry period > 0 (client-go's "
                f"rule), got {self.lease_duration_s}, {self.renew_deadline_s}, {self.retry_period_s}"
            )

    @property
    def collection(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    @property
    def path(self) -> str:
        return f"{self.collection}/{self.name}"


def _micro_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElection:
    """One candidate. `run(on_started, on_stopped)` stands until it leads, calls `on_started` in a task
    of its own, renews until it fails for the renew deadline, then cancels that task, awaits
    `on_stopped` and returns (stand again by calling `run` again). Clocks are injectable for tests."""

    def __init__(
        self,
        api: KubeApi,
        settings: LeaseSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        rng: random.Random | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self._clock = clock
        self._wall = wall
        self._rng = rng or random.Random()
        self._observed: JSONDict | None = None
        """The Lease's spec as last read, and when (on `clock`) it last changed."""
        self._observed_at = 0.0

    # --- one attempt ---------------------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease; False when another holder's lease is still valid or
        the write lost a race. Raises `KubeApiError` for other API failures."""
        s = self.settings
        now = _micro_time(self._wall())
        try:
            lease = await self.api.get(s.path)
        except KubeApiError as err:
            if not err.not_found:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": s.name, "namespace": s.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                created = await self.api.request(
                    "POST", f"/apis/coordination.k8s.io/v1/namespaces/{s.namespace}/leases", body
                )
            except KubeApiError as err2:
                if err2.status == 409:
                    return False
                raise
            self._observe(created.get("spec") or {})
            return True
        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        duration = spec.get("leaseDurationSeconds") or 0
        mine = holder == s.identity
        if holder and not mine and self._observed_at + float(duration) > self._clock():
            return False  # another holder, and its lease has not run out as we saw it
        transitions = int(spec.get("leaseTransitions") or 0)
        acquired = now if not mine else str(spec.get("acquireTime") or now)
        lease["spec"] = self._spec(acquired, now, transitions if mine else transitions + 1)
        try:
            updated = await self.api.request("PUT", s.path, lease)
        except KubeApiError as err:
            if err.status == 409:
                return False  # someone wrote it since our read
            raise
        self._observe(updated.get("spec") or {})
        return True

    def _spec(self, acquire_time: str, renew_time: str, transitions: int) -> JSONDict:
        return {
            "holderIdentity": self.settings.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_duration_s)),
            "acquireTime": acquire_time,
            "renewTime": renew_time,
            "leaseTransitions": transitions,
        }

    def _observe(self, spec: JSONDict) -> None:
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._clock()

    # --- the loops -----------------------------------------------------------------------------------

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except KubeApiError as err:
            log.warning("lease %s/%s: %s", self.settings.namespace, self.settings.name, err)
            return False

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        s = self.settings
        while True:
            if await self._attempt():
                return
            await asyncio.sleep(s.retry_period_s * (1 + JITTER * self._rng.random()))

    async def renew(self) -> None:
        """Keep the Lease; return when no renewal succeeded for the renew deadline."""
        s = self.settings
        last = self._clock()
        while True:
            await asyncio.sleep(s.retry_period_s)
            if await self._attempt():
                last = self._clock()
            elif self._clock() - last >= s.renew_deadline_s:
                return

    async def run(
        self, on_started: Callable[[], Coroutine[Any, Any, None]], on_stopped: Callable[[], Awaitable[None]]
    ) -> None:
        await self.acquire()
        leading: asyncio.Task[None] = asyncio.create_task(on_started(), name="leader-election-lead")
        try:
            await self.renew()
        finally:
            leading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await leading
            await asyncio.shield(on_stopped())

    async def release(self) -> bool:
        """Hand the Lease back if this candidate holds it (holder emptied, 1 s duration). Returns whether
        it did; an API failure is logged."""
        s = self.settings
        try:
            lease = await self.api.get(s.path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != s.identity:
                return False
            spec["holderIdentity"] = ""
            spec["leaseDurationSeconds"] = 1
            lease["spec"] = spec
            await self.api.request("PUT", s.path, lease)
        except KubeApiError as err:
            log.warning("could not release the lease %s/%s: %s", s.namespace, s.name, err)
            return False
        return True


__all__ = ["JITTER", "LeaseElection", "LeaseSettings"]
