"""The container runtime, as far as the stand-in plays it: what each started container gets from its
devices, recorded in `D/containers.json` so that tests and the demo read one place for device-plugin
and DRA containers alike.

For each container kubelet hands the runtime (kubernetes pkg/kubelet/cm/devicemanager/pod_devices.go
`deviceRunContainerOptions`, pkg/kubelet/cm/dra/manager.go `GetResources`):

- from the device plugins' Allocate answers, resource by resource (sorted by name; kubelet walks a Go
  map): env (the first value of a key wins), mounts and device nodes (the first of a container path
  wins), annotations, and the CDI device names a plugin returned (listed; not resolved here);
- from DRA, the CDI device IDs of the container's claims, which the runtime resolves through the CDI
  spec directories (`dra.cdi`) and applies over the above: this is where a DRA container's env, mounts
  and device nodes come from. An ID that does not resolve fails the container (CreateContainerError, as
  containerd's `CDI device injection failed: unresolvable CDI devices ...`).

The record (JSON, written atomically whenever a pod starts or ends, kept across restarts):

    {"containers":[{"podUID":"…","namespace":"default","pod":"p","container":"main",
      "cdiDevices":["k8s.gpu.hami.io/claim=…"],"env":["CUDA_DEVICE_MEMORY_LIMIT_0=4000m",…],
      "mounts":[{"containerPath":"…","hostPath":"…","options":["ro"]}],
      "deviceNodes":[{"path":"/dev/nvidia0","hostPath":"/dev/nvidia0","permissions":"rw"}],
      "hooks":[],"additionalGids":[],"annotations":{}}]}

A device plugin's read-only mount reads `"options":["ro"]` (containerd adds rbind/rprivate); a CDI
mount keeps the spec's options. Only device-provided parts are recorded: the pod spec's own env and
volumes are not.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hami_node.durable import write_atomic
from hami_node.plugin.api import api_pb2
from hami_sim.kubelet.dra.cdi import ContainerView, load_registry

log = logging.getLogger(__name__)


class ContainersFileError(ValueError):
    """`containers.json` does not parse or has the wrong shape."""


@dataclass(frozen=True)
class ContainerRecord:
    """What one started container got from its devices."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    cdi_devices: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    mounts: tuple[Mapping[str, Any], ...] = ()
    device_nodes: tuple[Mapping[str, Any], ...] = ()
    hooks: tuple[Mapping[str, Any], ...] = ()
    additional_gids: tuple[int, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def env_map(self) -> dict[str, str]:
        """The env as a dict (entries are unique by key)."""
        return dict(e.partition("=")[::2] for e in self.env)

    def to_json(self) -> dict[str, Any]:
        return {
            "podUID": self.pod_uid,
            "namespace": self.namespace,
            "pod": self.pod,
            "container": self.container,
            "cdiDevices": list(self.cdi_devices),
            "env": list(self.env),
            "mounts": [dict(m) for m in self.mounts],
            "deviceNodes": [dict(d) for d in self.device_nodes],
            "hooks": [dict(h) for h in self.hooks],
            "additionalGids": list(self.additional_gids),
            "annotations": dict(self.annotations),
        }

    @classmethod
    def from_json(cls, raw: Any, where: str) -> ContainerRecord:
        if not isinstance(raw, Mapping):
            raise ContainersFileError(f"{where}: expected an object")
        try:
            return cls(
                pod_uid=str(raw["podUID"]),
                namespace=str(raw["namespace"]),
                pod=str(raw["pod"]),
                container=str(raw["container"]),
                cdi_devices=tuple(str(d) for d in raw.get("cdiDevices") or []),
                env=tuple(str(e) for e in raw.get("env") or []),
                mounts=tuple(dict(m) for m in raw.get("mounts") or []),
                device_nodes=tuple(dict(d) for d in raw.get("deviceNodes") or []),
                hooks=tuple(dict(h) for h in raw.get("hooks") or []),
                additional_gids=tuple(int(g) for g in raw.get("additionalGids") or []),
                annotations={str(k): str(v) for k, v in (raw.get("annotations") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ContainersFileError(f"{where}: {type(exc).__name__}: {exc}") from None


def device_plugin_view(
    responses: Mapping[str, api_pb2.ContainerAllocateResponse],
) -> tuple[ContainerView, list[str], dict[str, str]]:
    """deviceRunContainerOptions: the container's env, mounts and device nodes from its device plugins'
    Allocate answers (per resource), the CDI names they returned and their annotations."""
    view = ContainerView()
    env_keys: set[str] = set()
    cdi: list[str] = []
    annotations: dict[str, str] = {}
    for resource in sorted(responses):
        response = responses[resource]
        for key in sorted(response.envs):
            if key not in env_keys:
                env_keys.add(key)
                view.env.append(f"{key}={response.envs[key]}")
        for mount in response.mounts:
            if all(m["containerPath"] != mount.container_path for m in view.mounts):
                view.mounts.append(
                    {
                        "containerPath": mount.container_path,
                        "hostPath": mount.host_path,
                        "options": ["ro"] if mount.read_only else [],
                    }
                )
        for device in response.devices:
            if all(d["path"] != device.container_path for d in view.device_nodes):
                view.device_nodes.append(
                    {
                        "path": device.container_path,
                        "hostPath": device.host_path,
                        "permissions": device.permissions,
                    }
                )
        for key in sorted(response.annotations):
            annotations.setdefault(key, response.annotations[key])
        for name in response.cdi_devices:
            if name.name not in cdi:
                cdi.append(name.name)
    return view, cdi, annotations


def container_record(
    pod: Mapping[str, Any],
    container: str,
    responses: Mapping[str, api_pb2.ContainerAllocateResponse],
    dra_cdi_ids: Sequence[str],
    cdi_dirs: Sequence[Path],
) -> ContainerRecord:
    """What the runtime gives `container`; raises `dra.cdi.CdiResolutionError` for DRA CDI IDs it
    cannot resolve."""
    view, cdi_names, annotations = device_plugin_view(responses)
    if dra_cdi_ids:
        view.apply(load_registry(cdi_dirs).resolve(dra_cdi_ids))
    meta = pod.get("metadata") or {}
    return ContainerRecord(
        pod_uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        pod=str(meta.get("name") or ""),
        container=container,
        cdi_devices=(*cdi_names, *dra_cdi_ids),
        env=tuple(view.env),
        mounts=tuple(view.mounts),
        device_nodes=tuple(view.device_nodes),
        hooks=tuple(view.hooks),
        additional_gids=tuple(view.additional_gids),
        annotations=annotations,
    )


@dataclass(frozen=True)
class Containers:
    """A read `containers.json`."""

    records: tuple[ContainerRecord, ...]

    def get(self, pod_uid: str, container: str) -> ContainerRecord | None:
        return next((r for r in self.records if r.pod_uid == pod_uid and r.container == container), None)

    def env(self, pod_uid: str, container: str) -> dict[str, str]:
        """The container's device-provided env ({} for a container the runtime did not start)."""
        record = self.get(pod_uid, container)
        return {} if record is None else record.env_map


def _encode_records(records: Iterable[ContainerRecord]) -> bytes:
    """The records as the comma-separated members of the file's list (compact: json's C encoder only
    runs without indentation)."""
    return b",".join(json.dumps(r.to_json(), separators=(",", ":")).encode() for r in records)


def _file(pieces: Iterable[bytes]) -> bytes:
    return b'{"containers":[' + b",".join(p for p in pieces if p) + b"]}\n"


def encode_containers(records: Iterable[ContainerRecord]) -> bytes:
    return _file([_encode_records(records)])


def decode_containers(raw: bytes) -> Containers:
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ContainersFileError(f"not JSON: {exc}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("containers"), list):
        raise ContainersFileError('expected {"containers": [...]}')
    return Containers(
        tuple(ContainerRecord.from_json(r, f"containers[{i}]") for i, r in enumerate(document["containers"]))
    )


def read_containers(path: str | os.PathLike[str]) -> Containers:
    """Read a node's `containers.json` (none yet: no containers)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return Containers(())
    except OSError as exc:
        raise ContainersFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return decode_containers(raw)
    except ContainersFileError as exc:
        raise ContainersFileError(f"{path}: {exc}") from None


class ContainerRuntime:
    """The node's record of started containers (`KubeletConfig.containers_path`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pods: dict[str, list[ContainerRecord]] = {}
        self._encoded: dict[str, bytes] = {}
        """Each pod's records, encoded once: the file is rewritten at every pod start and end."""

    def load(self) -> None:
        try:
            containers = read_containers(self.path)
        except ContainersFileError as exc:
            log.error("ignoring the container record: %s", exc)
            return
        self._pods = {}
        for record in containers.records:
            self._pods.setdefault(record.pod_uid, []).append(record)
        self._encoded = {uid: _encode_records(records) for uid, records in self._pods.items()}

    def record_pod(self, pod_uid: str, records: Sequence[ContainerRecord]) -> None:
        self._pods[pod_uid] = list(records)
        self._encoded[pod_uid] = _encode_records(records)
        self._write()

    def remove_pod(self, pod_uid: str) -> None:
        if self._pods.pop(pod_uid, None) is not None:
            self._encoded.pop(pod_uid, None)
            self._write()

    def retain_pods(self, active: Iterable[str]) -> None:
        """Forget the containers of every pod not in `active` (pods that went while the stand-in was
        down)."""
        keep = set(active)
        gone = [uid for uid in self._pods if uid not in keep]
        for uid in gone:
            del self._pods[uid]
            self._encoded.pop(uid, None)
        if gone:
            self._write()

    def get(self, pod_uid: str, container: str) -> ContainerRecord | None:
        return next((r for r in self._pods.get(pod_uid, ()) if r.container == container), None)

    def _write(self) -> None:
        try:
            write_atomic(self.path, _file(self._encoded.values()), mode=0o644)
        except OSError as exc:
            log.error("cannot write the container record %s: %s", self.path, exc)
