"""The chaos run's invariant checker: it reads only the API server (through the official `kubernetes`
client, never hami_kube or hami_control) and the kubelet stand-ins' state directories
(`kubelet_internal_checkpoint`, `dra_manager_state`, `containers.json`), decodes HAMi's annotations
(NVIDIA's and every other vendor's) and kubelet's files with its own decoders (`decoding`), and records
every broken invariant (`invariants`, where the kinds are listed) as a `Violation` with its evidence.

Races. The pieces are read one after the other: the pods, then the nodes, the claims, the slices, the
quotas, then each node's files. Between two reads a pod may be deleted, a container started, an
allocation annotation rewritten by the node daemon, so one pass can see sources that disagree for a
moment. A finding therefore becomes a violation only when **two consecutive `check_once` passes** both
find it (same kind and subject); a pass that could not read the API server counts as no pass. And the
container checks look only at containers the runtime has started (a record in `containers.json`) of
pods the API server still shows live, and only at those that ran for the whole read of their node's
files (`read_node_files`: `containers.json` is read before and after the checkpoints, so a container
starting or stopping meanwhile never shows with or without its devices by chance). `final_check`
reads twice in a row itself and keeps what both reads show, so call it once the cluster is meant to be quiet.

Each (kind, subject) is reported once: `check_once` and `final_check` return the new violations,
`violations` keeps them all, `counts()` counts them by kind.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import urllib3
from kubernetes import client, config

from hami_sim.chaos.decoding import (
    ContainerRecord,
    DecodeError,
    DeviceEntry,
    Gpu,
    VendorDevice,
    decode_containers,
    decode_device_checkpoint,
    decode_dra_checkpoint,
    decode_registered_devices,
)
from hami_sim.chaos.invariants import (
    DeviceKey,
    NodeFiles,
    Snapshot,
    Violation,
    final_findings,
    findings,
    kubelet_device_disagreements,
    registered_gpus,
    vendor_devices,
)

__all__ = ["CheckerReadError", "ClusterReader", "InvariantChecker", "Violation", "read_node_files"]

log = logging.getLogger(__name__)

USER_AGENT = "hami-sim-chaos-checker (python) hami-py"
"""The checker's User-Agent, so that a fault rule can leave the checker's reads alone (or not)."""

DEVICE_CHECKPOINT = "kubelet_internal_checkpoint"
DRA_CHECKPOINT = "dra_manager_state"
CONTAINERS = "containers.json"

PAGE = 500
READ_ATTEMPTS = 4
REQUEST_TIMEOUT_S = 30.0

_PATHS = {
    "pods": "/api/v1/pods",
    "nodes": "/api/v1/nodes",
    "resource_quotas": "/api/v1/resourcequotas",
    "resource_claims": "/apis/resource.k8s.io/v1/resourceclaims",
    "resource_slices": "/apis/resource.k8s.io/v1/resourceslices",
    "events": "/api/v1/events",
}
_OPTIONAL = frozenset({"resource_claims", "resource_slices"})
"""Lists a cluster without DRA does not serve (404: read as empty)."""


class CheckerReadError(RuntimeError):
    """The API server or a kubelet directory could not be read."""


class ClusterReader:
    """Reads one `Snapshot`: lists from the API server (paged, as JSON dicts) and each node's files."""

    def __init__(self, kubeconfig: Path, kubelet_dirs: Mapping[str, Path]) -> None:
        self._api = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]
        self._api.user_agent = USER_AGENT
        self._dirs = dict(kubelet_dirs)

    def close(self) -> None:
        self._api.close()

    def _get(self, path: str, query: list[tuple[str, Any]]) -> tuple[int, Any]:
        """One GET (retried on 429, 5xx and connection errors): (status, decoded body or None)."""
        error = ""
        for attempt in range(READ_ATTEMPTS):
            try:
                method, url, headers, body, post = self._api.param_serialize(
                    "GET",
                    path,
                    query_params=query,
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                )
                response = self._api.call_api(
                    method,
                    url,
                    header_params=headers,
                    body=body,
                    post_params=post,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
                status, data = int(response.status), response.read()
                if status == 200:
                    return status, json.loads(data)
                if status == 404:
                    return status, None
                error = f"GET {path}: {status} {response.reason}"
                if status not in (429, 500, 502, 503, 504):
                    break
            except client.ApiException as exc:
                error = f"GET {path}: {exc.status} {exc.reason}"
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                error = f"GET {path}: {type(exc).__name__}: {exc}"
            if attempt + 1 < READ_ATTEMPTS:
                time.sleep(0.2 * 2**attempt)
        raise CheckerReadError(error)

    def list(self, name: str) -> list[dict[str, Any]]:
        """Every object of one list (`_PATHS`), all pages."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query: list[tuple[str, Any]] = [("limit", PAGE)]
            if token:
                query.append(("continue", token))
            status, body = self._get(_PATHS[name], query)
            if status == 404 and name in _OPTIONAL:
                return []
            if not isinstance(body, dict):
                raise CheckerReadError(f"GET {_PATHS[name]}: answered {status} with {str(body)[:80]}")
            items.extend(i for i in body.get("items") or [] if isinstance(i, dict))
            token = str((body.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    def node_files(self, directory: Path) -> NodeFiles:
        return read_node_files(directory)

    def snapshot(self, *, at: float, wall_time: float, events: bool = False) -> Snapshot:
        """Pods first (the other sources are then at least as new as the pods they refer to)."""
        lists = {name: self.list(name) for name in _PATHS if name != "events"}
        return Snapshot(
            pods=lists["pods"],
            nodes=lists["nodes"],
            resource_claims=lists["resource_claims"],
            resource_slices=lists["resource_slices"],
            resource_quotas=lists["resource_quotas"],
            kubelet={node: self.node_files(d) for node, d in sorted(self._dirs.items())},
            events=self.list("events") if events else (),
            wall_time=wall_time,
            at=at,
        )


def read_node_files(directory: Path) -> NodeFiles:
    """One kubelet directory's state files, read so that they agree with each other.

    kubelet writes a container's devices (the checkpoint, the DRA state) before the runtime starts it
    and frees them only after the runtime has stopped it, so a container's devices outlive it on disk.
    Read one after the other, the files can still disagree: a container that starts between the read of
    the checkpoint and that of `containers.json` shows without its devices. So `containers.json` is read
    before and after the state files, and a container counts only when both reads show it the same: it
    ran for the whole read, so its devices were on disk all along. A container seen in one read only is
    starting or stopping; the next pass sees it (a disagreement that lasts is found in every pass)."""
    errors: dict[str, str] = {}

    def read(name: str, decode: Callable[[bytes], Any]) -> Any:
        try:
            raw = (directory / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            errors[name] = f"cannot read: {exc.strerror or exc}"
            return None
        try:
            return decode(raw)
        except DecodeError as exc:
            errors[name] = str(exc)
            return None

    def checkpoint(raw: bytes) -> tuple[tuple[DeviceEntry, ...], dict[str, tuple[str, ...]]]:
        return decode_device_checkpoint(raw), decode_registered_devices(raw)

    before: tuple[ContainerRecord, ...] | None = read(CONTAINERS, decode_containers)
    entries, registered = read(DEVICE_CHECKPOINT, checkpoint) or (None, None)
    claims = read(DRA_CHECKPOINT, decode_dra_checkpoint)
    after: tuple[ContainerRecord, ...] | None = read(CONTAINERS, decode_containers)
    containers = None
    if before is not None and after is not None:
        earlier = {(r.pod_uid, r.container): r for r in before}
        containers = tuple(r for r in after if earlier.get((r.pod_uid, r.container)) == r)
    return NodeFiles(
        device_entries=entries,
        registered_devices=registered,
        claim_entries=claims,
        containers=containers,
        errors=errors,
    )


class InvariantChecker:
    """Checks the cluster's invariants, pass by pass (see the module docstring).

    `kubelet_dirs` maps each node to its kubelet stand-in's directory; `bind_timeout_s` is how long a
    pod may stay `hami.io/bind-phase=allocating` after its `hami.io/bind-time`; `clock` stamps the
    violations (`Violation.at`); `wall_clock` (Unix time) is what bind-time is compared with.
    """

    def __init__(
        self,
        kubeconfig: Path,
        kubelet_dirs: Mapping[str, Path],
        *,
        bind_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not bind_timeout_s > 0:
            raise ValueError(f"bind_timeout_s: must be positive, got {bind_timeout_s!r}")
        self._reader = ClusterReader(kubeconfig, kubelet_dirs)
        self._bind_timeout_s = bind_timeout_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._gpus: dict[str, tuple[str, Gpu]] = {}
        self._vendor_devices: dict[DeviceKey, VendorDevice] = {}
        self._previous: dict[tuple[str, str], Violation] = {}
        self._reported: set[tuple[str, str]] = set()
        self.violations: list[Violation] = []
        self.passes = 0
        self.skipped_passes = 0
        """Passes that could not read the API server or a kubelet directory (logged, not counted)."""
        self.final_snapshot: Snapshot | None = None
        """What `final_check` read last (the cluster at the end of a run)."""
        self.kubelet_disagreements = 0
        """At the final check: started vendor containers whose kubelet device IDs name other devices than
        their pod's annotation (`vendor_invariants.kubelet_device_disagreements`; not a violation)."""

    # -- lifecycle ---------------------------------------------------------------------------------------

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> InvariantChecker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- passes ------------------------------------------------------------------------------------------

    def _findings(self, snapshot: Snapshot, final: bool) -> dict[tuple[str, str], Violation]:
        self._gpus.update(registered_gpus(snapshot.nodes))
        self._vendor_devices.update(vendor_devices(snapshot.nodes))
        found = findings(
            snapshot,
            bind_timeout_s=self._bind_timeout_s,
            known_gpus=self._gpus,
            known_devices=self._vendor_devices,
        )
        if final:
            found += final_findings(snapshot)
            self.kubelet_disagreements = kubelet_device_disagreements(snapshot, self._vendor_devices)
        return {v.key: v for v in found}

    def _report(self, confirmed: list[Violation]) -> list[Violation]:
        new = [v for v in confirmed if v.key not in self._reported]
        for violation in new:
            self._reported.add(violation.key)
            self.violations.append(violation)
            log.warning("violation %s %s: %s", violation.kind, violation.subject, violation.message)
        return new

    @staticmethod
    def _confirm(first: Violation, second: Violation) -> Violation:
        evidence = {**second.evidence, "first_seen_at": first.at}
        return Violation(second.kind, second.subject, second.message, evidence, second.at)

    def check_once(self) -> list[Violation]:
        """One pass: the violations found in this pass and the one before it, not reported before.
        A pass that cannot read its sources is skipped (`skipped_passes`) and returns []."""
        with self._lock:
            try:
                snapshot = self._reader.snapshot(at=self._clock(), wall_time=self._wall_clock())
            except CheckerReadError as exc:
                self.skipped_passes += 1
                log.warning("checker pass skipped: %s", exc)
                return []
            found = self._findings(snapshot, final=False)
            confirmed = [self._confirm(self._previous[k], v) for k, v in found.items() if k in self._previous]
            self._previous = found
            self.passes += 1
            return self._report(confirmed)

    def final_check(self) -> list[Violation]:
        """The end of a run: the invariants of every pass and those of `invariants.final_findings`, over
        two reads in a row (kept when both show them). Raises `CheckerReadError` when the sources
        cannot be read: the end of a run must be verified, not assumed."""
        with self._lock:
            reads = [
                self._reader.snapshot(at=self._clock(), wall_time=self._wall_clock(), events=True)
                for _ in range(2)
            ]
            first, second = (self._findings(s, final=True) for s in reads)
            confirmed = [self._confirm(first[k], v) for k, v in second.items() if k in first]
            self._previous = {}
            self.final_snapshot = reads[-1]
            return self._report(confirmed)

    def counts(self) -> dict[str, int]:
        """Violations so far, by kind."""
        with self._lock:
            return dict(collections.Counter(v.kind for v in self.violations))
