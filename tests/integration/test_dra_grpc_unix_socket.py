"""Smoke test of the generated kubelet DRA stubs over real gRPC on real Unix sockets: a minimal DRA
plugin serves `pluginregistration.Registration` on its registration socket and DRAPlugin v1 and v1beta1
on one dra.sock (as the upstream helper does, k8s.io/dynamic-resource-allocation kubeletplugin), and a
kubelet-like client walks GetInfo -> NotifyRegistrationStatus -> NodePrepareResources ->
NodeUnprepareResources with the generated stubs. The server records the full method paths it was called
on, which are the ones the kubelet dials."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_node.dra.api.registration import api_pb2 as reg_pb2
from hami_node.dra.api.registration import api_pb2_grpc as reg_grpc
from hami_node.dra.api.v1 import api_pb2 as v1_pb2
from hami_node.dra.api.v1 import api_pb2_grpc as v1_grpc
from hami_node.dra.api.v1beta1 import api_pb2 as v1beta1_pb2
from hami_node.dra.api.v1beta1 import api_pb2_grpc as v1beta1_grpc

TIMEOUT = 10.0
DRIVER = "gpu.hami.io"
SUPPORTED = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


class RecordMethods(grpc.ServerInterceptor):
    """Remembers the full gRPC method path of every call the server receives."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.methods: list[str] = []

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        with self.lock:
            self.methods.append(handler_call_details.method)
        return continuation(handler_call_details)


@dataclass
class Registration(reg_grpc.RegistrationServicer):
    endpoint: str
    statuses: list[tuple[bool, str]] = field(default_factory=list)

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type="DRAPlugin", name=DRIVER, endpoint=self.endpoint, supported_versions=SUPPORTED
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        self.statuses.append((request.plugin_registered, request.error))
        return reg_pb2.RegistrationStatusResponse()


class DRAPluginV1(v1_grpc.DRAPluginServicer):
    """Prepares every claim as one device per claim; a claim named "broken" fails with an error."""

    def NodePrepareResources(
        self, request: v1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1_pb2.NodePrepareResourcesResponse:
        response = v1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.name == "broken":
                response.claims[claim.uid].error = f"claim {claim.namespace}/{claim.name}: not allocated"
                continue
            response.claims[claim.uid].devices.append(
                v1_pb2.Device(
                    request_names=["gpu"],
                    pool_name="node-1",
                    device_name="gpu-0",
                    cdi_device_ids=[f"{DRIVER}/gpu=gpu-0-{claim.uid}"],
                    share_id="share-1",
                )
            )
        return response

    def NodeUnprepareResources(
        self, request: v1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1_pb2.NodeUnprepareResourcesResponse:
        response = v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(v1_pb2.NodeUnprepareResourceResponse())
        return response


class DRAPluginV1beta1(v1beta1_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self, request: v1beta1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1_pb2.NodePrepareResourcesResponse:
        response = v1beta1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].devices.append(
                v1beta1_pb2.Device(pool_name="node-1", device_name="gpu-1")
            )
        return response


@dataclass
class Plugin:
    registration_socket: Path
    dra_socket: Path
    registration: Registration
    recorder: RecordMethods


def start_server(socket_path: Path, recorder: RecordMethods) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[recorder])
    port = server.add_insecure_port(f"unix://{socket_path}")
    assert port == 1, f"could not bind {socket_path}"
    return server


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    # A short path of our own: Unix socket paths are limited to ~107 bytes.
    directory = Path(tempfile.mkdtemp(prefix="hami-dra-"))
    recorder = RecordMethods()
    plugin = Plugin(
        registration_socket=directory / f"{DRIVER}-reg.sock",
        dra_socket=directory / "dra.sock",
        registration=Registration(endpoint=str(directory / "dra.sock")),
        recorder=recorder,
    )
    servers: list[grpc.Server] = []
    try:
        dra = start_server(plugin.dra_socket, recorder)
        servers.append(dra)
        v1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(), dra)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1(), dra)
        reg = start_server(plugin.registration_socket, recorder)
        servers.append(reg)
        reg_grpc.add_RegistrationServicer_to_server(plugin.registration, reg)
        for server in servers:
            server.start()
        yield plugin
    finally:
        for server in servers:
            server.stop(grace=None).wait(TIMEOUT)
        shutil.rmtree(directory, ignore_errors=True)


def dial(path: Path | str) -> grpc.Channel:
    channel = grpc.insecure_channel(f"unix://{path}")
    grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
    return channel


def test_kubelet_flow_registers_then_prepares_and_unprepares_over_v1(plugin: Plugin) -> None:
    with dial(plugin.registration_socket) as channel:
        registration = reg_grpc.RegistrationStub(channel)
        info = registration.GetInfo(reg_pb2.InfoRequest(), timeout=TIMEOUT)
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(plugin.dra_socket))
        assert list(info.supported_versions) == SUPPORTED
        registration.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT
        )
    assert plugin.registration.statuses == [(True, "")]

    with dial(info.endpoint) as channel:
        dra = v1_grpc.DRAPluginStub(channel)
        claims = [
            v1_pb2.Claim(namespace="default", uid="uid-a", name="a"),
            v1_pb2.Claim(namespace="default", uid="uid-b", name="broken"),
        ]
        prepared = dra.NodePrepareResources(
            v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=TIMEOUT
        )
        assert sorted(prepared.claims) == ["uid-a", "uid-b"]
        (device,) = prepared.claims["uid-a"].devices
        assert (list(device.request_names), device.pool_name, device.device_name) == (
            ["gpu"],
            "node-1",
            "gpu-0",
        )
        assert list(device.cdi_device_ids) == [f"{DRIVER}/gpu=gpu-0-uid-a"]
        assert device.HasField("share_id") and device.share_id == "share-1"
        assert prepared.claims["uid-a"].error == ""
        assert prepared.claims["uid-b"].error == "claim default/broken: not allocated"
        assert list(prepared.claims["uid-b"].devices) == []

        unprepared = dra.NodeUnprepareResources(
            v1_pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=TIMEOUT
        )
        assert dict(unprepared.claims) == {"uid-a": v1_pb2.NodeUnprepareResourceResponse()}

    assert plugin.recorder.methods == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    ]


def test_v1beta1_is_served_beside_v1_on_the_same_socket(plugin: Plugin) -> None:
    with dial(plugin.dra_socket) as channel:
        request = v1beta1_pb2.NodePrepareResourcesRequest(
            claims=[v1beta1_pb2.Claim(namespace="default", uid="uid-c", name="c")]
        )
        prepared = v1beta1_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=TIMEOUT)
        assert [(d.pool_name, d.device_name) for d in prepared.claims["uid-c"].devices] == [
            ("node-1", "gpu-1")
        ]
        with pytest.raises(grpc.RpcError) as caught:
            v1beta1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                v1beta1_pb2.NodeUnprepareResourcesRequest(), timeout=TIMEOUT
            )
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert plugin.recorder.methods == [
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    ]
