"""hami-node's client of kubelet's PodResources API (`hami_node.plugin.kubelet_pods.KubeletPods`) against
the kubelet stand-in's server (`hami_sim.kubelet.podresources.server`, kubelet's rate limit included) on
a real Unix socket: what it reads of the pods and their devices, keeping to kubelet's call budget, and
the error when nothing answers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_node.plugin.api import api_pb2 as dp
from hami_node.plugin.kubelet_pods import KubeletPod, KubeletPods, KubeletPodsError, admitting
from hami_sim.kubelet.checkpoint import NO_TOPOLOGY
from hami_sim.kubelet.podresources.server import PodResourcesServer
from tests.builders import container, pod

GPU = "nvidia.com/gpu"


class Pods:
    """The stand-in's pod side: the active pods as given."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    @property
    def synced(self) -> bool:
        return True

    def active_pods(self) -> list[dict[str, Any]]:
        return list(self.pods)

    def pod_by_name(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


class Devices:
    """The stand-in's device side: (pod uid, container) -> resource -> device IDs, no topology."""

    def __init__(self, held: dict[tuple[str, str], dict[str, tuple[str, ...]]]) -> None:
        self.held = held

    def container_devices_by_numa(
        self, pod_uid: str, container: str
    ) -> dict[str, dict[int, tuple[str, ...]]]:
        return {r: {NO_TOPOLOGY: ids} for r, ids in self.held.get((pod_uid, container), {}).items()}

    def allocatable_devices(self) -> dict[str, list[dp.Device]]:
        return {}

    def retain_pods(self, active: Iterable[str]) -> None:
        pass


class Served:
    """A PodResources server on its own loop thread."""

    def __init__(self, socket: Path, pods: Pods, devices: Devices) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = PodResourcesServer(socket, devices, pods, seed="test")
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hkp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(short_dir: Path) -> Iterator[Path]:
    """Pod a (admitted: main holds GPU-1-0 and an other resource's device, side car none) and pod b
    (being admitted: main holds nothing yet)."""
    a = pod(
        "a",
        container("main", limits={GPU: "1"}),
        uid="uid-a",
        init=[container("side", limits={GPU: "1"}, restart_policy="Always"), container("setup")],
    )
    b = pod("b", container("main", limits={GPU: "1"}), uid="uid-b", namespace="team")
    devices = Devices({("uid-a", "main"): {GPU: ("GPU-1-0",), "example.com/nic": ("nic-0",)}})
    socket = short_dir / "pod-resources" / "kubelet.sock"
    server = Served(socket, Pods([a, b]), devices)
    try:
        yield socket
    finally:
        server.close()


def test_list_reads_each_listed_container_with_the_devices_of_its_resource(served: Path) -> None:
    client = KubeletPods(served, GPU)
    try:
        listed = sorted(client.list(), key=lambda p: p.key)
    finally:
        client.close()
    assert listed == [
        KubeletPod("default", "a", {"side": frozenset(), "main": frozenset({"GPU-1-0"})}),
        KubeletPod("team", "b", {"main": frozenset()}),
    ]
    assert admitting(listed, "team/b", "main", ["main"])
    assert not admitting(listed, "default/a", "main", ["side", "main"])  # admitted: it holds its device
    assert not admitting(listed, "default/c", "main", ["main"])  # not in kubelet's pod manager
    assert not admitting(listed, "default/a", "setup", ["setup", "main"])  # its app container holds one


def test_the_client_waits_for_kubelets_budget(served: Path) -> None:
    """Its own bucket, a little under kubelet's (9 at once, then 95 a second): 25 calls take at least
    16 / 95 s, every one answered (a refusal, when the two clocks disagree, is sent again)."""
    client = KubeletPods(served, GPU)
    try:
        started = time.monotonic()
        for _ in range(25):
            assert len(client.list()) == 2
        elapsed = time.monotonic() - started
    finally:
        client.close()
    assert elapsed >= 16 / 95 - 0.01
    assert client.calls == 25 + client.refused


def test_calls_kubelet_refuses_for_its_rate_limit_are_sent_again(served: Path) -> None:
    greedy = KubeletPods(served, GPU, qps=10_000.0, burst=100)  # ignores kubelet's budget
    try:
        for _ in range(25):
            assert len(greedy.list()) == 2
    finally:
        greedy.close()
    assert greedy.refused > 0 and greedy.calls == 25 + greedy.refused


def test_no_kubelet_on_the_socket_is_an_error_naming_it(short_dir: Path) -> None:
    missing = short_dir / "pod-resources" / "kubelet.sock"
    client = KubeletPods(missing, GPU, timeout_s=0.5)
    try:
        with pytest.raises(KubeletPodsError, match=f"kubelet's PodResources API at {missing}: UNAVAILABLE"):
            client.list()
    finally:
        client.close()
