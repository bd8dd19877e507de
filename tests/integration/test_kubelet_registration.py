"""Kubelet stand-in, device-manager side: Registration, ListAndWatch, stream end, re-registration,
grace period and restart, over real gRPC on real Unix sockets (no API server)."""

from __future__ import annotations

import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_sim.kubelet import KubeletConfig, KubeletRunner, Snapshot
from tests.integration.kubelet_plugin import FakePlugin, devices

RES = "example.com/dev"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_kubelet(short_dir: Path) -> Iterator[Callable[..., KubeletRunner]]:
    runners: list[KubeletRunner] = []

    def make(**options: object) -> KubeletRunner:
        config = KubeletConfig("node-1", short_dir / "dp", **options)  # type: ignore[arg-type]
        runner = KubeletRunner(config)
        runner.start()
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.stop()


@pytest.fixture
def make_plugin(short_dir: Path) -> Iterator[Callable[..., FakePlugin]]:
    plugins: list[FakePlugin] = []

    def make(endpoint: str = "fake.sock", **options: object) -> FakePlugin:
        plugin = FakePlugin(short_dir / "dp", endpoint, **options)  # type: ignore[arg-type]
        plugin.serve()
        plugins.append(plugin)
        return plugin

    yield make
    for plugin in plugins:
        plugin.stop()


def has(resource: str, check: Callable[..., bool]) -> Callable[[Snapshot], bool]:
    def predicate(snapshot: Snapshot) -> bool:
        state = snapshot.resource(resource)
        return state is not None and check(state)

    return predicate


def test_serves_registration_in_a_0750_directory(make_kubelet: Callable[..., KubeletRunner]) -> None:
    kubelet = make_kubelet()
    directory = kubelet.config.directory
    assert stat.S_IMODE(directory.stat().st_mode) == 0o750
    assert stat.S_ISSOCK(kubelet.config.kubelet_socket.stat().st_mode)
    kubelet.stop()
    assert not kubelet.config.kubelet_socket.exists()


def test_start_deletes_stale_sockets_but_keeps_files(
    short_dir: Path, make_kubelet: Callable[..., KubeletRunner]
) -> None:
    directory = short_dir / "dp"
    directory.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(directory / "old-plugin.sock"))
    stale.close()
    (directory / "notes.txt").write_text("keep me")
    (directory / "sub").mkdir()
    make_kubelet()
    assert not (directory / "old-plugin.sock").exists()
    assert (directory / "notes.txt").read_text() == "keep me"
    assert (directory / "sub").is_dir()


def test_register_asks_options_before_returning_and_follows_list_and_watch(
    make_kubelet: Callable[..., KubeletRunner], make_plugin: Callable[..., FakePlugin]
) -> None:
    kubelet = make_kubelet()
    plugin = make_plugin(preferred=True, initial=devices("a", "b", "c"))
    plugin.register(RES)
    # Register returned only after the kubelet dialled back and asked for the options.
    assert plugin.options_called.is_set()
    snapshot = kubelet.wait_for_devices(has(RES, lambda s: s.healthy == {"a", "b", "c"}))
    state = snapshot.resources[RES]
    assert state.connected and state.registrations == 1
    assert state.options is not None and state.options.get_preferred_allocation_available
    assert (state.capacity, state.allocatable) == (3, 3)


def test_list_and_watch_replaces_the_whole_set(
    make_kubelet: Callable[..., KubeletRunner], make_plugin: Callable[..., FakePlugin]
) -> None:
    kubelet = make_kubelet()
    plugin = make_plugin(initial=devices("a", "b", "c"))
    plugin.register(RES)
    kubelet.wait_for_devices(has(RES, lambda s: s.updates == 1))
    plugin.set_devices(devices("a", "d", unhealthy=["a"]))
    snapshot = kubelet.wait_for_devices(has(RES, lambda s: s.updates == 2))
    state = snapshot.resources[RES]
    assert [d.ID for d in state.devices] == ["a", "d"]
    assert state.healthy == {"d"} and state.unhealthy == {"a"}
    assert (state.capacity, state.allocatable) == (2, 1)
    plugin.set_devices(devices("a", "d"))
    snapshot = kubelet.wait_for_devices(has(RES, lambda s: s.updates == 3))
    assert snapshot.resources[RES].healthy == {"a", "d"}
    assert snapshot.resources[RES].unhealthy == frozenset()


def test_stream_end_marks_every_device_unhealthy(
    make_kubelet: Callable[..., KubeletRunner], make_plugin: Callable[..., FakePlugin]
) -> None:
    kubelet = make_kubelet()
    plugin = make_plugin(initial=devices("a", "b", "c", unhealthy=["c"]))
    plugin.register(RES)
    kubelet.wait_for_devices(has(RES, lambda s: s.allocatable == 2))
    plugin.stop()
    snapshot = kubelet.wait_for_devices(has(RES, lambda s: not s.connected))
    state = snapshot.resources[RES]
    assert state.healthy == frozenset() and state.unhealthy == {"a", "b", "c"}
    assert (state.capacity, state.allocatable) == (3, 0)


@pytest.mark.parametrize(
    ("version", "resource", "message"),
    [
        (
            "v1alpha",
            RES,
            'requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]',
        ),
        ("v1beta1", "kubernetes.io/dev", 'the ResourceName "kubernetes.io/dev" is invalid'),
        ("v1beta1", "dev", 'the ResourceName "dev" is invalid'),
        ("v1beta1", "requests.example.com/dev", 'the ResourceName "requests.example.com/dev" is invalid'),
        ("v1beta1", "Example.com/dev", 'the ResourceName "Example.com/dev" is invalid'),
    ],
)
def test_bad_registrations_are_refused_with_kubelets_text(
    make_kubelet: Callable[..., KubeletRunner],
    make_plugin: Callable[..., FakePlugin],
    version: str,
    resource: str,
    message: str,
) -> None:
    kubelet = make_kubelet()
    plugin = make_plugin()
    with pytest.raises(grpc.RpcError) as caught:
        plugin.register(resource, version=version)
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == message
    assert not plugin.options_called.is_set()
    assert kubelet.snapshot().resources == {}


def test_dial_failure_is_refused(
    make_kubelet: Callable[..., KubeletRunner], make_plugin: Callable[..., FakePlugin]
) -> None:
    make_kubelet(dial_timeout=0.5)
    plugin = make_plugin()
    with pytest.raises(grpc.RpcError) as caught:
        plugin.register(RES, endpoint="nobody-here.sock")
    assert caught.value.details() == "failed to dial device plugin: context deadline exceeded"


def test_reregistration_replaces_the_endpoint_and_the_old_stream_end_is_harmless(
    make_kubelet: Callable[..., KubeletRunner], make_plugin: Callable[..., FakePlugin]
) -> None:
    kubelet = make_kubelet()
    old = make_plugin("old.sock", initial=devices("a", "b"))
    old.register(RES)
    kubelet.wait_for_devices(has(RES, lambda s: s.healthy == {"a", "b"}))
    new = make_plugin("new.sock", initial=devices("x", "y", "z"))
    new.register(RES)
    kubelet.wait_for_devices(has(RES, lambda s: s.registrations == 2 and s.healthy == {"x", "y", "z"}))
    old.stop()  # the old stream ends late: it must not disconnect the new registration
    new.set_devices(devices("x", "y"))
    snapshot = kubelet.wait_for_devices(has(RES, lambda s: s.healthy == {"x", "y"}))
    assert snapshot.resources[RES].connected


def test_dead_plugin_resource_is_dropped_after_the_grace_period(
    make_kubelet: Callable[..., KubeletRunner], make_plugin: Callable[..., FakePlugin]
) -> None:
    kubelet = make_kubelet(endpoint_stop_grace=0.3)
    plugin = make_plugin(initial=devices("a"))
    plugin.register(RES)
    kubelet.wait_for_devices(has(RES, lambda s: s.allocatable == 1))
    plugin.stop()
    kubelet.wait_for_devices(lambda s: RES not in s.resources)
    assert kubelet.run(_capacity(kubelet)) == {RES: (0, 0)}


def _capacity(kubelet: KubeletRunner) -> Callable[[], Coroutine[Any, Any, dict[str, tuple[int, int]]]]:
    async def read() -> dict[str, tuple[int, int]]:
        return kubelet.kubelet.device_manager.capacity()

    return read


def test_restart_deletes_sockets_and_waits_for_reregistration(
    short_dir: Path, make_kubelet: Callable[..., KubeletRunner], make_plugin: Callable[..., FakePlugin]
) -> None:
    kubelet = make_kubelet()
    plugin = make_plugin(initial=devices("a", "b"))
    plugin.register(RES)
    kubelet.wait_for_devices(has(RES, lambda s: s.allocatable == 2))
    directory = short_dir / "dp"
    (directory / "notes.txt").write_text("kept")
    kubelet.restart()
    assert not plugin.socket.exists(), "the plugin's socket survived the kubelet restart"
    assert (directory / "notes.txt").read_text() == "kept"
    assert (directory / "kubelet_internal_checkpoint").is_file()
    assert stat.S_ISSOCK(kubelet.config.kubelet_socket.stat().st_mode)
    state = kubelet.snapshot().resources[RES]
    assert not state.connected
    assert (state.capacity, state.allocatable) == (0, 0)
    # The plugin notices, serves again and registers again.
    plugin.stop()
    plugin.serve()
    plugin.register(RES)
    snapshot = kubelet.wait_for_devices(has(RES, lambda s: s.connected and s.allocatable == 2))
    assert snapshot.resources[RES].registrations == 2
