"""Leader election for the extender: only one replica filters, scores and binds at a time, because the
binder's assumptions and pending windows live in one process's memory. Every replica serves the webhook.

The election itself is `hami_kube.election` (client-go's algorithm on a `coordination.k8s.io/v1` Lease).
Around it:

- On winning: the watch caches are rebuilt from the API (a fresh list), the pending window is rebuilt
  from the pods still `bind-phase=allocating` (bound by the previous leader, not yet answered by their
  node daemon), then the pod is labelled `hami.io/scheduler-role=leader` (HAMi's label, which the
  extender Service selects) and only then does the replica answer `/filter`, `/prioritize`, `/bind`.
- On losing (a renewal failed for the renew deadline): it stops answering at once ("not leader"),
  drops the label, and stands again as a candidate.
- While not leading, the extender routes answer with an `Error` saying so, and `/readyz/extender` is 503.

Timing (kube-scheduler's defaults): lease 15 s, renew deadline 10 s, retry 2 s. A killed leader is
replaced within about one lease duration; a leader cut off from the API stops answering after the renew
deadline, before its lease can be taken over.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping

from hami_kube.client import KubeApi
from hami_kube.election import LeaseElection, LeaseSettings
from hami_kube.errors import KubeApiError

log = logging.getLogger(__name__)

LEADER_LABEL = "hami.io/scheduler-role"
LEADER_VALUE = "leader"


async def label_pod(api: KubeApi, namespace: str, name: str, value: str | None) -> None:
    """Set (or, with None, remove) HAMi's leader label on this replica's pod (`namespace`/`name` from the
    downward API; nothing to do without them). A failure is logged: the label is informational."""
    if not name or not namespace:
        return
    body = {"metadata": {"labels": {LEADER_LABEL: value}}}
    try:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        await api.patch(path, body)
    except KubeApiError as err:
        log.warning("cannot label pod %s/%s %s=%s: %s", namespace, name, LEADER_LABEL, value, err)


def default_identity(pod_name: str) -> str:
    """The pod's name when given (the downward API's POD_NAME, `ControlConfig.pod_name`), else the host
    name; plus a random suffix so a restarted process never renews its predecessor's lease by accident."""
    base = pod_name or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    """Runs the election until cancelled. `leading` is True only between a finished `on_elected` and the
    loss of the lease. `on_elected` (rebuild caches, label the pod) runs before `leading` turns True;
    `on_deposed` after it turns False."""

    def __init__(
        self,
        settings: LeaseSettings,
        api: KubeApi,
        *,
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.identity = settings.identity
        self.election = LeaseElection(api, settings)
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.leading = False
        self.terms = 0

    async def _lead(self) -> None:
        try:
            await self.on_elected()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("taking over as leader failed; answering anyway from the watch caches")
        self.leading = True
        self.terms += 1
        log.info(
            "%s leads the extender (lease %s/%s)",
            self.identity,
            self.settings.namespace,
            self.settings.name,
        )
        await asyncio.Event().wait()  # until the election cancels this task on losing the lease

    async def _deposed(self) -> None:
        was = self.leading
        self.leading = False
        if was:
            log.warning(
                "%s lost the lease %s: no longer answering the extender",
                self.identity,
                self.settings.name,
            )
        try:
            await self.on_deposed()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stepping down as leader failed")

    async def run(self) -> None:
        s = self.settings
        try:
            while True:
                try:
                    await self.election.run(self._lead, self._deposed)
                    # run() returns after losing the lease (callbacks done): stand again.
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("leader election failed; standing again in %.0f s", s.retry_period_s)
                    if self.leading:
                        await self._deposed()
                    await asyncio.sleep(s.retry_period_s)
        finally:
            if self.leading:
                self.leading = False
                await asyncio.shield(self._deposed())

    async def release(self) -> None:
        """On a clean stop, hand the lease back so a follower takes over at once (client-go's
        ReleaseOnCancel)."""
        if await self.election.release():
            log.info("released the lease %s/%s", self.settings.namespace, self.settings.name)


def extender_gate(
    elector: LeaderElector | None, readiness: Callable[[], Mapping[str, bool]]
) -> Callable[[], str | None]:
    """Why this replica must not answer the extender now, or None: it is not the leader (with an
    elector), or its caches have not listed yet (`readiness`: cache -> synced)."""

    def gate() -> str | None:
        if elector is not None and not elector.leading:
            return f"not leader: {elector.identity} does not lead the extender, ask the leader"
        waiting = sorted(name for name, ready in readiness().items() if not ready)
        if not waiting:
            return None
        return f"hami-control is starting: its caches are not synced yet (waiting for {', '.join(waiting)})"

    return gate


__all__ = ["LEADER_LABEL", "LEADER_VALUE", "LeaderElector", "default_identity", "extender_gate", "label_pod"]
