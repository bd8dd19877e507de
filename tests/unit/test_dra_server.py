"""hami_node.dra.server's pure parts: the socket names (plain, and the upstream helper's rolling-update
names, shortened to fit a Unix socket path) and the health stream's device list."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from hami_api import dra
from hami_node.config import load_config
from hami_node.devices import GPUStatus
from hami_node.dra.api.health.v1alpha1 import api_pb2 as health_pb2
from hami_node.dra.server import (
    SUPPORTED_SERVICES,
    dra_socket,
    health_response,
    registration_socket,
    rolling_registration_name,
)
from hami_node.health import xid_reason
from hami_node.unixgrpc import MAX_SOCKET_PATH
from tests.builders import physical_gpu

UID = "0c4b0b9e-1f6c-4f0e-9c0e-2a3b4c5d6e7f"


def test_the_plain_socket_names_are_the_upstream_helpers() -> None:
    plain = load_config(["--node-name", "n1", "--mode", "dra"], {}, lambda p: "")
    assert registration_socket(plain) == Path(f"/var/lib/kubelet/plugins_registry/{dra.DRIVER}-reg.sock")
    assert dra_socket(plain) == Path(f"/var/lib/kubelet/plugins/{dra.DRIVER}/dra.sock")


def test_rolling_update_names_carry_the_pod_uid() -> None:
    argv = [
        "--node-name",
        "n1",
        "--mode",
        "dra",
        "--dra-rolling-update-uid",
        UID,
        "--kubelet-registry-dir",
        "/r",
    ]
    rolling = load_config(argv, {}, lambda p: "")
    assert registration_socket(rolling) == Path(f"/r/{dra.DRIVER}-{UID}-reg.sock")
    assert dra_socket(rolling) == Path(f"/var/lib/kubelet/plugins/{dra.DRIVER}/dra-{UID}.sock")
    # Under kubelet's own directory the full name does not fit a socket path: the UID's hash does.
    default = load_config(argv[:-2], {}, lambda p: "")
    uid_hash = base64.urlsafe_b64encode(hashlib.sha256(UID.encode()).digest()[:8]).decode().rstrip("=")
    assert registration_socket(default).name == f"{dra.DRIVER}-{uid_hash}-reg.sock"


def test_a_rolling_update_name_too_long_for_a_socket_falls_back_to_hashes() -> None:
    uid_hash = base64.urlsafe_b64encode(hashlib.sha256(UID.encode()).digest()[:8]).decode().rstrip("=")
    medium = Path("/" + "d" * (MAX_SOCKET_PATH - len(f"/{dra.DRIVER}-{uid_hash}-reg.sock")))
    assert rolling_registration_name(medium, dra.DRIVER, UID) == f"{dra.DRIVER}-{uid_hash}-reg.sock"
    deep = Path("/" + "d" * 60)
    name = rolling_registration_name(deep, dra.DRIVER, UID)
    both = hashlib.sha256(f"{dra.DRIVER}\x00{UID}".encode()).digest()[:16]
    assert name == "dra-" + base64.urlsafe_b64encode(both).decode().rstrip("=") + "-reg.sock"
    assert len(str(deep / name)) <= MAX_SOCKET_PATH + 1


def test_getinfo_lists_v1_first_then_v1beta1_then_the_health_service() -> None:
    assert SUPPORTED_SERVICES == ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")


def test_the_health_list_names_every_device_and_why_one_is_unhealthy() -> None:
    gpus = (
        GPUStatus(physical_gpu("GPU-0", 0)),
        GPUStatus(physical_gpu("GPU-1", 1, minor=5), fault=xid_reason(79)),
    )
    response = health_response(gpus, "n1", 1700000000, 30)
    assert [
        (
            d.device.pool_name,
            d.device.device_name,
            d.health,
            d.message,
            d.last_updated_time,
            d.health_check_timeout_seconds,
        )
        for d in response.devices
    ] == [
        ("n1", "hami-gpu-0", health_pb2.HEALTHY, "", 1700000000, 30),
        ("n1", "hami-gpu-5", health_pb2.UNHEALTHY, "xid-79", 1700000000, 30),
    ]
