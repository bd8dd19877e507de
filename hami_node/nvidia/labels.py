"""The node labels NVIDIA's GPU feature discovery sets for these modes (internal/lm/resource.go,
mig-strategy.go, strategy.go, nvml.go, v0.20.0): per resource `<res>.product`, `.count`, `.replicas`,
`.sharing-strategy`, `.memory` (GPUs also `.family`, `.compute.major`, `.compute.minor`; MIG resources
`.multiprocessors`, `.slices.gi`, `.slices.ci`, `.engines.*`), `nvidia.com/mig.strategy`,
`nvidia.com/mig.capable` and `nvidia.com/mps.capable`.

Labels are keyed by the resource's original name (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`), never the
`.shared` rename; `-SHARED` is appended to the product when a resource is shared and not renamed. Where
NVIDIA iterates Go maps (several GPU models on one node, several MIG types under mixed) the later label
of the same key wins at random; here the devices' index order decides (the last model wins).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hami_node.nvidia.config import MigStrategy, Sharing, SharingStrategy
from hami_node.nvidia.device_map import GPU_RESOURCE, MigAttributes, NvidiaDevice, mig_layout_problem

Labels = dict[str, str]

_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9\-_. ]")


def sanitise(text: str) -> str:
    """`sanitise`: drop characters outside `[A-Za-z0-9-_. ]`, then join the words with `-`."""
    return "-".join(_NOT_ALLOWED.sub("", text).split())


def arch_family(major: int, minor: int) -> str:
    """`getArchFamily`."""
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    if major == 12:
        return "blackwell"
    if major == 13:
        return "rubin"
    return families.get(major, "undefined")


class _ResourceLabeler:
    """`resourceLabeler`: `sharing` None means sharing disabled (MIG-enabled parents: replicas 0)."""

    def __init__(self, resource: str, sharing: Sharing | None) -> None:
        self.resource = resource
        self.sharing = sharing
        self.info = sharing.replicated.resource(resource) if sharing is not None else None

    def key(self, suffix: str) -> str:
        return f"{self.resource}.{suffix}"

    def replicas(self) -> int:
        if self.sharing is None:
            return 0
        if self.info is not None and self.info.replicas > 0:
            return self.info.replicas
        return 1

    def product(self, *parts: str) -> str:
        stripped = [sanitise(p) for p in parts if p]
        if not stripped:
            return ""
        if self.info is not None and self.info.replicas > 1 and not self.info.rename:
            stripped.append("SHARED")
        return "-".join(stripped)

    def base(self, count: int, *parts: str) -> Labels:
        replicas = self.replicas()
        strategy = SharingStrategy.NONE
        if self.sharing is not None and replicas > 1:
            strategy = self.sharing.strategy
        return {
            self.key("product"): self.product(*parts),
            self.key("count"): str(count),
            self.key("replicas"): str(replicas),
            self.key("sharing-strategy"): strategy.value,
        }


def gpu_resource_labels(device: NvidiaDevice, count: int, sharing: Sharing | None) -> Labels:
    """`NewGPUResourceLabeler` (`sharing` None: `...WithoutSharing`)."""
    if count == 0:
        return {}
    rl = _ResourceLabeler(GPU_RESOURCE, sharing)
    labels = rl.base(count, device.product_name)
    if device.memory_mib:
        labels[rl.key("memory")] = str(device.memory_mib)
    if device.compute_capability is not None and device.compute_capability[0] != 0:
        major, minor = device.compute_capability
        labels[rl.key("family")] = arch_family(major, minor)
        labels[rl.key("compute.major")] = str(major)
        labels[rl.key("compute.minor")] = str(minor)
    return labels


def mig_name(device: NvidiaDevice) -> str:
    """The MIG device's name in labels and mixed resources: its profile with `+` made `.`."""
    return (device.mig_profile or "").replace("+", ".")


def mig_resource_labels(resource: str, device: NvidiaDevice, count: int, sharing: Sharing | None) -> Labels:
    """`NewMIGResourceLabeler`: product `<model>-MIG-<profile>` and the MIG device's attributes."""
    if count == 0:
        return {}
    rl = _ResourceLabeler(resource, sharing)
    labels = rl.base(count, device.product_name, "MIG", mig_name(device))
    a = device.mig_attributes or MigAttributes(memory_mib=device.memory_mib)
    attributes = {
        "memory": a.memory_mib,
        "multiprocessors": a.multiprocessors,
        "slices.gi": a.gi_slices,
        "slices.ci": a.ci_slices,
        "engines.copy": a.copy_engines,
        "engines.decoder": a.decoders,
        "engines.encoder": a.encoders,
        "engines.jpeg": a.jpeg_engines,
        "engines.ofa": a.ofa_engines,
    }
    labels.update({rl.key(k): str(v) for k, v in attributes.items()})
    return labels


def _gpu_labels(gpus: Sequence[NvidiaDevice], sharing: Sharing) -> Labels:
    """`newGPULabelers`: MIG-enabled GPUs without sharing first, then full GPUs (which override them);
    counts per model name over both."""
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.product_name] = counts.get(g.product_name, 0) + 1
    labels: Labels = {}
    enabled = {g.product_name: g for g in gpus if g.mig_enabled}
    for name, g in enabled.items():
        labels.update(gpu_resource_labels(g, counts[name], None))
    full = {g.product_name: g for g in gpus if not g.mig_enabled}
    for name, g in full.items():
        labels.update(gpu_resource_labels(g, counts[name], sharing))
    return labels


def _invalid_single(gpu: NvidiaDevice, reason: str) -> tuple[Labels, str]:
    """`newInvalidMigStrategyLabeler`: `<model>-MIG-INVALID`, zeros, an empty sharing strategy."""
    rl = _ResourceLabeler(GPU_RESOURCE, None)
    product = rl.product(gpu.product_name, "MIG", "INVALID")
    labels = {rl.key("product"): product} if product else {}
    labels.update(
        {rl.key("count"): "0", rl.key("replicas"): "0", rl.key("sharing-strategy"): "", rl.key("memory"): "0"}
    )
    return labels, f"Invalid configuration detected for mig-strategy=single: {reason}"


def _mig_types(migs: Sequence[NvidiaDevice]) -> dict[str, tuple[NvidiaDevice, int]]:
    types: dict[str, tuple[NvidiaDevice, int]] = {}
    for m in migs:
        first, count = types.get(mig_name(m), (m, 0))
        types[mig_name(m)] = (first, count + 1)
    return types


def resource_labels(
    devices: Sequence[NvidiaDevice], strategy: MigStrategy, sharing: Sharing
) -> tuple[Labels, tuple[str, ...]]:
    """`NewResourceLabeler`: the labels of every resource on the node, and GFD's warnings (an invalid
    single layout). `devices` are the GPUs and MIG devices (`NvidiaDevice`)."""
    gpus = sorted((d for d in devices if not d.is_mig), key=lambda d: d.index)
    if not gpus:
        return {}, ()
    labels = _gpu_labels(gpus, sharing)
    if strategy is MigStrategy.NONE:
        return labels, ()
    labels["nvidia.com/mig.strategy"] = strategy.value
    enabled = [g for g in gpus if g.mig_enabled]
    migs = sorted((d for d in devices if d.is_mig), key=lambda d: (d.index, d.mig_index or 0))
    warnings: tuple[str, ...] = ()
    if strategy is MigStrategy.SINGLE:
        if not enabled:
            return labels, ()
        with_migs = {m.parent_uuid for m in migs}
        reason = None
        if any(g.uuid not in with_migs for g in enabled):
            reason = "at least one MIG device is enabled but empty"
        elif len(enabled) != len(gpus):
            reason = "devices with MIG enabled and disable detected"
        elif len(_mig_types(migs)) != 1:
            reason = "more than one MIG device type present on node"
        if reason is not None:
            invalid, warning = _invalid_single(enabled[0], reason)
            labels.update(invalid)
            return labels, (warning,)
        for first, count in _mig_types(migs).values():
            labels.update(mig_resource_labels(GPU_RESOURCE, first, count, sharing))
        return labels, warnings
    for name, (first, count) in _mig_types(migs).items():
        labels.update(mig_resource_labels(f"nvidia.com/mig-{name}", first, count, sharing))
    return labels, warnings


def node_labels(
    devices: Sequence[NvidiaDevice], strategy: MigStrategy, sharing: Sharing
) -> tuple[Labels, tuple[str, ...]]:
    """The labels above plus `nvidia.com/mig.capable` (any GPU supports MIG) and `nvidia.com/mps.capable`
    (MPS sharing configured and no GPU in MIG mode: NVIDIA's GFD fails there with `MPS sharing is not
    supported for mig devices`; here the label is false and a warning says why). No devices: no labels."""
    gpus = [d for d in devices if not d.is_mig]
    if not gpus:
        return {}, ()
    labels, warnings = resource_labels(devices, strategy, sharing)
    labels["nvidia.com/mig.capable"] = "true" if any(g.mig_capable for g in gpus) else "false"
    mps = sharing.strategy is SharingStrategy.MPS
    mig_enabled = any(g.mig_enabled for g in gpus)
    labels["nvidia.com/mps.capable"] = "true" if mps and not mig_enabled else "false"
    if mps and mig_enabled:
        warnings = (*warnings, "MPS sharing is not supported for mig devices")
    return labels, warnings


def single_strategy_problem(devices: Sequence[NvidiaDevice]) -> str | None:
    """Why the single strategy cannot serve this layout (the device plugin's rule), or None."""
    return mig_layout_problem(devices, uniform=True)


__all__ = [
    "Labels",
    "arch_family",
    "gpu_resource_labels",
    "mig_name",
    "mig_resource_labels",
    "node_labels",
    "resource_labels",
    "sanitise",
    "single_strategy_problem",
]
