"""Constants of the kubelet Device Plugin API v1beta1 (k8s.io/kubelet constants.go and gRPC paths)."""

from typing import Final

VERSION: Final = "v1beta1"
"""The API version a plugin sends in RegisterRequest.version."""

SUPPORTED_VERSIONS: Final[tuple[str, ...]] = ("v1beta1",)
"""Versions the kubelet accepts in Register."""

DEVICE_PLUGIN_PATH: Final = "/var/lib/kubelet/device-plugins/"
"""Directory holding kubelet.sock, the plugins' sockets and the kubelet checkpoint."""

KUBELET_SOCKET: Final = DEVICE_PLUGIN_PATH + "kubelet.sock"
"""Where the kubelet serves the Registration service."""

CHECKPOINT_FILE: Final = "kubelet_internal_checkpoint"
"""File name (inside DEVICE_PLUGIN_PATH) of the device manager's checkpoint."""

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

KUBELET_PRESTART_CONTAINER_RPC_TIMEOUT_SECONDS: Final = 30
"""Deadline the kubelet puts on PreStartContainer; the other RPCs have none."""

REGISTRATION_SERVICE: Final = "v1beta1.Registration"
DEVICE_PLUGIN_SERVICE: Final = "v1beta1.DevicePlugin"

REGISTER_METHOD: Final = "/v1beta1.Registration/Register"
GET_DEVICE_PLUGIN_OPTIONS_METHOD: Final = "/v1beta1.DevicePlugin/GetDevicePluginOptions"
LIST_AND_WATCH_METHOD: Final = "/v1beta1.DevicePlugin/ListAndWatch"
GET_PREFERRED_ALLOCATION_METHOD: Final = "/v1beta1.DevicePlugin/GetPreferredAllocation"
ALLOCATE_METHOD: Final = "/v1beta1.DevicePlugin/Allocate"
PRE_START_CONTAINER_METHOD: Final = "/v1beta1.DevicePlugin/PreStartContainer"
