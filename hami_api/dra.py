"""The DRA wire contract of hami-py: the driver name, the device schema and the capacity names that the
node daemon publishes in its ResourceSlices, the webhook's claim templates select on, and the stand-ins
read. Pure: names and small functions over data, no I/O.

The defaults are those of HAMi's DRA driver (Project-HAMi/k8s-dra-driver,
`cmd/hami-kubelet-plugin/hami_core.go` and `chart/hami-dra-driver/templates/deviceclass-hami-gpu.yaml`),
so that DeviceClasses and claims written for HAMi-DRA keep working: driver and DeviceClass
`hami-core-gpu.project-hami.io`, one device `hami-gpu-<minor>` per GPU with `type: hami-gpu`, and the
consumable capacities `memory` (bytes) and `cores` (percent of the SMs, 0..100).
"""

from __future__ import annotations

from typing import Final

DRIVER: Final = "hami-core-gpu.project-hami.io"
"""The driver name: ResourceSlice `spec.driver`, the kubelet plugin's name, the attribute domain."""

DEVICE_CLASS: Final = DRIVER
"""The DeviceClass HAMi-DRA installs (same name as the driver)."""

DEVICE_TYPE: Final = "hami-gpu"
"""The value of the `type` attribute of every GPU device."""

DEVICE_NAME_PREFIX: Final = "hami-gpu-"

API_GROUP: Final = "resource.k8s.io"
API_VERSION: Final = "resource.k8s.io/v1"

# Attribute names (unqualified: they belong to the driver's domain).
ATTR_TYPE: Final = "type"
ATTR_UUID: Final = "uuid"
ATTR_MINOR: Final = "minor"
ATTR_INDEX: Final = "index"
ATTR_PRODUCT_NAME: Final = "productName"
ATTR_DRIVER_VERSION: Final = "driverVersion"
ATTR_PCI_BUS_ID: Final = "pcieBusID"
ATTR_NUMA_NODE: Final = "numaNode"

# Consumable capacities.
CAPACITY_MEMORY: Final = "memory"
"""Device memory in bytes; request policy: default = the whole GPU, range 1 Mi .. whole, step 1 Mi."""
CAPACITY_CORES: Final = "cores"
"""Percent of the GPU's SMs; request policy: default 100, range 0..100, step 1."""

MIB: Final = 1 << 20

DEVICE_CLASS_SELECTOR: Final = (
    f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].{ATTR_TYPE} == '{DEVICE_TYPE}'"
)
"""The CEL selector of HAMi-DRA's DeviceClass."""


def device_name(minor: int) -> str:
    """The device name of the GPU with this minor number (HAMi's `CanonicalName`)."""
    return f"{DEVICE_NAME_PREFIX}{minor}"


def qualified(name: str, driver: str = DRIVER) -> str:
    """`<driver>/<name>`: an attribute or capacity name qualified by the driver's domain, as constraints
    (`matchAttribute`, `distinctAttribute`) write them."""
    return f"{driver}/{name}"
