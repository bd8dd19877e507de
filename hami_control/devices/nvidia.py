"""NVIDIA in the vendor registry (HAMi pkg/device/nvidia/device.go): its names, and its request read by
the one reader the NVIDIA path already uses (`hami_api.resources.container_request`).

NVIDIA keeps its own, faster path through the extender: the vectorised GPU table (`gputable`) and
`fit.fit_pod` (kubelet's init-container device reuse, NUMA binding, topology, the fragmentation policy),
the webhook's NVIDIA rules (`webhook`) and the binder. So this vendor is `native`: the registry lists
it (resource names for quota, the extender's managed resources, `kubectl hami`), but its Fit, mutation
and annotations are those modules', not this class's methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami_api.annotations import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_HANDSHAKE,
    NODE_REGISTER,
    NOUSE_GPU_TYPE,
    NOUSE_GPU_UUID,
    USE_GPU_TYPE,
    USE_GPU_UUID,
)
from hami_api.errors import RequestError
from hami_api.mig_alloc import AllowedMigProfiles, valid_profile_name
from hami_api.resources import UNSET_PERCENTAGE, RequestDefaults, ResourceNames, container_request
from hami_api.types import NVIDIA
from hami_control.devices.base import (
    DeviceRequest,
    HealthRule,
    Inventory,
    LockKind,
    Vendor,
    VendorNames,
)
from hami_control.devices.config import Section

COMMON_WORD = NVIDIA
_NAMES = ResourceNames()
_DEFAULTS = RequestDefaults()


def names(resources: ResourceNames = _NAMES, memory_factor: int = 1) -> VendorNames:
    return VendorNames(
        common_word=COMMON_WORD,
        family="nvidia",
        count=resources.count,
        memory=resources.memory,
        cores=resources.cores,
        memory_factor=memory_factor,
        to_allocate=DEVICES_TO_ALLOCATE,
        allocated=DEVICES_ALLOCATED,
        register=NODE_REGISTER,
        inventory=Inventory.JSON,
        handshake=NODE_HANDSHAKE,
        health=HealthRule.HANDSHAKE,
        lock=LockKind.MUTEX,
        use_uuid=USE_GPU_UUID,
        nouse_uuid=NOUSE_GPU_UUID,
        use_type=USE_GPU_TYPE,
        nouse_type=NOUSE_GPU_TYPE,
        extra_resources=(resources.memory_percentage, resources.priority),
    )


class Nvidia(Vendor):
    """NVIDIA GPUs: see the module docstring (`native`: the extender's own NVIDIA path decides)."""

    native = True

    def __init__(self, resources: ResourceNames = _NAMES, defaults: RequestDefaults = _DEFAULTS) -> None:
        super().__init__(names(resources, defaults.memory_factor))
        self.resources = resources
        self.defaults = defaults

    def request(self, container: Mapping[str, Any]) -> DeviceRequest | None:
        try:
            asked = container_request(container, self.resources, self.defaults)
        except RequestError:
            return None
        if asked is None:
            return None
        percentage = UNSET_PERCENTAGE if asked.mem_percentage is None else asked.mem_percentage
        return DeviceRequest(asked.nums, COMMON_WORD, asked.memreq, percentage, asked.coresreq)


def mig_profile_allowlist(nvidia: Section) -> tuple[AllowedMigProfiles, ...]:
    """`nvidia.migProfileAllowlist` read and checked as HAMi's ValidateMigProfileAllowlist
    (pkg/device/nvidia/mig_profiles.go; its InitNvidiaDevice stops on an error): every entry has models
    and profiles, every profile is `<N>g.<...>`. Raises `ConfigError` naming the entry, its line and the
    value. The scheduler reads no more of it (profiles and placements come from the register); the
    node matches models against NVML names (`mig_alloc.allowed_profiles_for`)."""
    out: list[AllowedMigProfiles] = []
    for entry in nvidia.sections("migProfileAllowlist"):
        models, profiles = entry.strings("models"), entry.strings("profiles")
        entry.finish()
        if not models or not profiles:
            raise entry.fail(None, "MIG profile allowlist must define models and profiles")
        for i, profile in enumerate(profiles):
            if not valid_profile_name(profile):
                raise Section(entry.document, (*entry.path, "profiles"), {}).fail(
                    i, "invalid MIG profile (want <N>g.<memory>, such as 1g.5gb)", profile
                )
        out.append(AllowedMigProfiles(tuple(models), tuple(profiles)))
    return tuple(out)


__all__ = ["COMMON_WORD", "Nvidia", "mig_profile_allowlist", "names"]
