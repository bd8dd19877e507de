"""Registering a plugin whose socket appeared in `plugins_registry`, as kubelet's plugin manager does it
(pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go `GenerateRegisterPluginFunc`):

1. dial the registration socket, blocking, for up to 10 s (`dialTimeoutDuration`);
2. `GetInfo` with a 1 s deadline;
3. pick the handler by the plugin's `type` (only `DRAPlugin` here: kubelet's device plugins register
   on kubelet.sock, and CSI is not modelled); another type gets
   `NotifyRegistrationStatus(false, "RegisterPlugin error -- no handler registered for plugin type: ...")`;
4. an empty `endpoint` means the registration socket itself;
5. validate (the DRA handler checks the supported services: `choose_service`); on failure
   `NotifyRegistrationStatus(false, "RegisterPlugin error -- plugin validation failed with err: ...")`;
6. the plugin enters the actual state of the world, then the handler registers it; a refusal there
   (an endpoint already registered for the driver) is notified as
   `"RegisterPlugin error -- plugin registration failed with err: ..."`;
7. `NotifyRegistrationStatus(true, "")`, 5 s deadline (`notifyTimeoutDuration`).

How kubelet chooses the DRA service (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go
`validateSupportedServices`): walk the plugin's `supported_versions` in the plugin's order and take the
first one kubelet supports (1.34 and later: `v1.DRAPlugin`, `v1beta1.DRAPlugin`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import grpc

from hami_node.dra.api.registration import api_pb2 as reg_pb2
from hami_node.dra.api.registration import api_pb2_grpc as reg_grpc
from hami_sim.kubelet import resources as msg
from hami_sim.kubelet.dra.claims import go_quoted_list

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
"""The plugin type DRA plugins give in GetInfo (k8s.io/kubelet pluginregistration constants)."""

V1_SERVICE = "v1.DRAPlugin"
V1BETA1_SERVICE = "v1beta1.DRAPlugin"
SERVICES_SUPPORTED_BY_KUBELET = (V1_SERVICE, V1BETA1_SERVICE)
"""Kubelet 1.34+'s servicesSupportedByKubelet, most recent first."""

DIAL_TIMEOUT_SECONDS = 10.0
GET_INFO_TIMEOUT_SECONDS = 1.0
NOTIFY_TIMEOUT_SECONDS = 5.0

CHANNEL_OPTIONS = (
    # Each dial its own subchannel: a plugin that restarted must not inherit another channel's
    # reconnect backoff; reconnect quickly (kubelet uses gRPC's defaults, 1 s growing to 2 min).
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class ServiceChoiceError(ValueError):
    """The plugin offers no DRA service kubelet can use; the message is kubelet's."""


def choose_service(
    supported: Sequence[str], kubelet_supports: Sequence[str] = SERVICES_SUPPORTED_BY_KUBELET
) -> str:
    """The service kubelet talks to: the first of the plugin's list (in the plugin's order) that kubelet
    supports."""
    if not supported:
        raise ServiceChoiceError("empty list of supported gRPC services (aka supported versions)")
    for service in supported:
        if service in kubelet_supports:
            return service
    raise ServiceChoiceError(
        f"none of services supported by the plugin ({go_quoted_list(supported)}) are supported by the "
        f"kubelet ({go_quoted_list(kubelet_supports)})"
    )


def validation_error(driver: str, endpoint: str, error: str) -> str:
    """The DRA handler's ValidatePlugin / RegisterPlugin wrapping of a service-choice error."""
    return f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: {error}"


class RegistrationFailed(Exception):
    """The registration operation failed (kubelet retries it with backoff); the text is kubelet's."""


@dataclass(frozen=True)
class PluginInfo:
    """What GetInfo told: the driver name, its DRA endpoint (the socket path when it gave none), the
    services it offers."""

    socket_path: str
    driver: str
    endpoint: str
    supported: tuple[str, ...]


RegisterHandler = Callable[[PluginInfo, str], Awaitable[None]]
"""Installs a validated plugin with its chosen service; raises `RegistrationRefused` to refuse it."""


class RegistrationRefused(Exception):
    """The DRA handler refused a validated plugin (e.g. its endpoint is registered already)."""


def _rpc_text(exc: grpc.aio.AioRpcError) -> str:
    return msg.go_rpc_error(exc.code(), exc.details())


async def _notify(stub: reg_grpc.RegistrationStub, registered: bool, error: str) -> None:
    """operation_generator.go notifyPlugin: raises `RegistrationFailed` with `error` (the plugin was
    refused) or with the RPC's failure."""
    try:
        await stub.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=registered, error=error),
            timeout=NOTIFY_TIMEOUT_SECONDS,
        )
    except grpc.aio.AioRpcError as exc:
        raise RegistrationFailed(f"{error}: {_rpc_text(exc)}") from None
    if error:
        raise RegistrationFailed(error)


async def register_plugin(
    socket_path: str,
    add_to_actual_state: Callable[[PluginInfo], None],
    register: RegisterHandler,
    *,
    dial_timeout: float = DIAL_TIMEOUT_SECONDS,
) -> PluginInfo:
    """Run kubelet's registration operation for the socket at `socket_path` (see the module docstring).
    Returns what GetInfo told; raises `RegistrationFailed` with kubelet's text."""
    channel = grpc.aio.insecure_channel(f"unix://{socket_path}", options=CHANNEL_OPTIONS)
    try:
        try:
            await asyncio.wait_for(channel.channel_ready(), dial_timeout)
        except TimeoutError:
            raise RegistrationFailed(
                f"RegisterPlugin error -- dial failed at socket {socket_path}, err: failed to dial socket "
                f"{socket_path}, err: context deadline exceeded"
            ) from None
        stub = reg_grpc.RegistrationStub(channel)
        try:
            info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationFailed(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket "
                f"{socket_path}, err: {_rpc_text(exc)}"
            ) from None
        if info.type != DRA_PLUGIN_TYPE:
            error = (
                f"RegisterPlugin error -- no handler registered for plugin type: {info.type} "
                f"at socket {socket_path}"
            )
            await _notify_refusal(stub, socket_path, error, error)
        plugin = PluginInfo(
            socket_path, info.name, info.endpoint or socket_path, tuple(info.supported_versions)
        )
        try:
            service = choose_service(plugin.supported)
        except ServiceChoiceError as exc:
            error = validation_error(plugin.driver, plugin.endpoint, str(exc))
            await _notify_refusal(
                stub,
                socket_path,
                f"RegisterPlugin error -- plugin validation failed with err: {error}",
                "RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed",
            )
        add_to_actual_state(plugin)
        try:
            await register(plugin, service)
        except RegistrationRefused as exc:
            await _notify(stub, False, f"RegisterPlugin error -- plugin registration failed with err: {exc}")
        try:
            await _notify(stub, True, "")
        except RegistrationFailed as exc:
            raise RegistrationFailed(
                "RegisterPlugin error -- failed to send registration status at socket "
                f"{socket_path}, err: {exc}"
            ) from None
        return plugin
    finally:
        await channel.close(None)


async def _notify_refusal(
    stub: reg_grpc.RegistrationStub, socket_path: str, error: str, failure: str
) -> NoReturn:
    """Tell the plugin it was refused (`error`), then fail the operation with `failure`, or with
    kubelet's text for a notification that did not get through."""
    try:
        await _notify(stub, False, error)
    except RegistrationFailed as exc:
        if str(exc) != error:
            raise RegistrationFailed(
                f"RegisterPlugin error -- failed to send error at socket {socket_path}, err: {exc}"
            ) from None
    raise RegistrationFailed(failure)
