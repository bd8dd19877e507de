"""hami_node.unixgrpc's server limits over a real Unix socket: a message over the receive limit is refused
with RESOURCE_EXHAUSTED and the server keeps serving the next, ordinary call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hami_node.plugin.api import api_pb2, api_pb2_grpc
from hami_node.unixgrpc import MAX_RECEIVE_MESSAGE_BYTES, remove_own_socket, start_unix_server


class EchoPlugin(api_pb2_grpc.DevicePluginServicer):
    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(envs={"IDS": ",".join(c.devices_ids)})
                for c in request.container_requests
            ]
        )


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    path = tmp_path / "limits.sock"
    server, identity = start_unix_server(
        path,
        lambda s: api_pb2_grpc.add_DevicePluginServicer_to_server(EchoPlugin(), s),
        max_workers=2,
        thread_name_prefix="limits-test",
    )
    try:
        with grpc.insecure_channel(f"unix://{path}") as ch:
            yield ch
    finally:
        server.stop(None).wait(5)
        remove_own_socket(path, identity)


def test_a_message_over_the_receive_limit_is_refused_and_the_server_keeps_serving(
    channel: grpc.Channel,
) -> None:
    stub = api_pb2_grpc.DevicePluginStub(channel)
    huge = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-" + "x" * 1000] * 1100)]
    )
    assert huge.ByteSize() > MAX_RECEIVE_MESSAGE_BYTES
    with pytest.raises(grpc.RpcError) as info:
        stub.Allocate(huge, timeout=10)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    ordinary = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-a"])]
    )
    answer = stub.Allocate(ordinary, timeout=10)
    assert answer.container_responses[0].envs["IDS"] == "GPU-a"
