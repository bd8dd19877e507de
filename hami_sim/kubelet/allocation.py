"""Which devices each pod's containers hold (kubelet's podDevices), pure bookkeeping."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hami_node.plugin.api import api_pb2
from hami_sim.kubelet.checkpoint import PodDeviceEntry


@dataclass(frozen=True)
class ContainerDevices:
    """One (pod, container, resource): the devices by NUMA node and the plugin's Allocate answer."""

    device_ids: Mapping[int, tuple[str, ...]]
    response: api_pb2.ContainerAllocateResponse

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(d for ids in self.device_ids.values() for d in ids)


class PodDevices:
    """pod UID -> container name -> resource name -> ContainerDevices."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, dict[str, ContainerDevices]]] = {}

    def insert(
        self,
        pod_uid: str,
        container: str,
        resource: str,
        device_ids: Mapping[int, tuple[str, ...]],
        response: api_pb2.ContainerAllocateResponse,
    ) -> None:
        containers = self._pods.setdefault(pod_uid, {})
        containers.setdefault(container, {})[resource] = ContainerDevices(dict(device_ids), response)

    def container_devices(self, pod_uid: str, container: str, resource: str) -> frozenset[str] | None:
        held = self._pods.get(pod_uid, {}).get(container, {}).get(resource)
        return None if held is None else held.ids

    def container_resources(self, pod_uid: str, container: str) -> dict[str, ContainerDevices]:
        return dict(self._pods.get(pod_uid, {}).get(container, {}))

    def pods(self) -> frozenset[str]:
        return frozenset(self._pods)

    def delete(self, pod_uids: Iterable[str]) -> bool:
        """Forget these pods; True when any was known."""
        removed = False
        for uid in pod_uids:
            removed = self._pods.pop(uid, None) is not None or removed
        return removed

    def devices(self) -> dict[str, set[str]]:
        """Every device in use, per resource."""
        in_use: dict[str, set[str]] = {}
        for containers in self._pods.values():
            for resources in containers.values():
                for resource, held in resources.items():
                    in_use.setdefault(resource, set()).update(held.ids)
        return in_use

    def entries(self) -> list[PodDeviceEntry]:
        return [
            PodDeviceEntry(uid, container, resource, held.device_ids, held.response)
            for uid, containers in self._pods.items()
            for container, resources in containers.items()
            for resource, held in resources.items()
        ]

    @classmethod
    def from_entries(cls, entries: Iterable[PodDeviceEntry]) -> PodDevices:
        pod_devices = cls()
        for e in entries:
            pod_devices.insert(e.pod_uid, e.container_name, e.resource_name, e.device_ids, e.response)
        return pod_devices
