"""Which vendor a device belongs to: the `vendor` label of hami-control's device metrics and the VENDOR
column of `kubectl hami`. Pure.

The vendor is named by its family (`VendorNames.family`: `nvidia`, `hygon`, `cambricon`, `ascend`, ...,
the device config's key), so a vendor with several common words (Enflame's GCU and DRS, Kunlun's XPU and
vXPU, the Ascend chips) is one vendor. NVIDIA's GPUs are known as such (the cache keeps them apart); the
other vendors' devices are told apart by HAMi's own rule for handing devices to a request (podfit's
`getNodeResources`): a device belongs to the vendor whose common word its Type contains,
case-insensitively (the Type equal to a common word first, then the longest common word contained, so
`Ascend910B4-1` is not taken for `Ascend910B4`'s). A slice's vendor is the Type its pod annotation
carries (`GPUSlice.vendor`). A Type no vendor of the registry names (a device no request of HAMi's could
be handed) is `unknown`.
"""

from __future__ import annotations

from collections.abc import Iterable

from hami_api.types import NVIDIA
from hami_control.devices.base import Vendor

NVIDIA_FAMILY = "nvidia"
"""NVIDIA's family (`devices.nvidia`'s `VendorNames.family`)."""
UNKNOWN_FAMILY = "unknown"
"""The family of a device Type no vendor of the registry names."""
_MEMO = 1024
"""Types remembered at most (a slice's Type comes from a pod annotation: not trusted to be few)."""


class VendorFamilies:
    """Device Type -> vendor family for the registry's vendors (see the module docstring). Answers are
    memoised per Type (up to `_MEMO` of them); the table itself never changes, so one instance may be
    read from any thread."""

    def __init__(self, vendors: Iterable[Vendor]) -> None:
        words: dict[str, str] = {}
        for vendor in vendors:
            if not vendor.native:
                words.setdefault(vendor.names.common_word.upper(), vendor.names.family)
        self._exact = words
        self._words = tuple(sorted(words.items(), key=lambda item: (-len(item[0]), item[0])))
        self._known: dict[str, str] = {}

    def of_type(self, device_type: str) -> str:
        """The family of a device of another vendor than NVIDIA, from its Type."""
        family = self._known.get(device_type)
        if family is None:
            upper = device_type.upper()
            family = self._exact.get(upper) or next(
                (f for word, f in self._words if word and word in upper), UNKNOWN_FAMILY
            )
            if len(self._known) < _MEMO:
                self._known[device_type] = family
        return family

    def of_slice(self, vendor: str) -> str:
        """The family of a pod's slice from its `GPUSlice.vendor` (NVIDIA's, or the vendor's device Type)."""
        return NVIDIA_FAMILY if vendor == NVIDIA else self.of_type(vendor)


__all__ = ["NVIDIA_FAMILY", "UNKNOWN_FAMILY", "VendorFamilies"]
