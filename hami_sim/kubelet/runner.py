"""`KubeletRunner`: one kubelet stand-in on its own event loop in a thread, with blocking helpers
(tests, the demo). Every wait takes a timeout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from hami_sim.kubelet.checkpoint import Checkpoint, read_checkpoint
from hami_sim.kubelet.config import KubeletConfig
from hami_sim.kubelet.devicemanager import Snapshot
from hami_sim.kubelet.dra.checkpoint import ClaimInfoState, read_dra_checkpoint
from hami_sim.kubelet.dra.manager import DraManager
from hami_sim.kubelet.pods import AdmissionResult
from hami_sim.kubelet.runtime import Containers, read_containers
from hami_sim.kubelet.standin import Kubelet

log = logging.getLogger(__name__)

T = TypeVar("T")


class KubeletRunner:
    """>>> with KubeletRunner(KubeletConfig("node-1", Path(d), kubeconfig=kc)) as kubelet:  # doctest: +SKIP
    ...     kubelet.wait_for_devices(lambda s: s.resource("nvidia.com/gpu") is not None, timeout=10)
    """

    def __init__(self, config: KubeletConfig) -> None:
        self.config = config
        self.kubelet = Kubelet(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def start(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            return
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=f"kubelet-{self.config.node_name}", daemon=True
        )
        self._thread.start()
        try:
            ready.result(timeout)
        except BaseException:
            self.stop()
            raise

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        self._stop = asyncio.Event()
        try:
            await self.kubelet.start()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            await self._stop.wait()
        finally:
            await self.kubelet.stop()

    def stop(self, timeout: float = 30.0) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("kubelet %s did not stop within %.1fs", self.config.node_name, timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> KubeletRunner:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def run(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30.0) -> T:
        """Run `factory()` on the kubelet's loop and return its result."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the kubelet stand-in is not running")
        return asyncio.run_coroutine_threadsafe(factory(), loop).result(timeout)

    def snapshot(self) -> Snapshot:
        async def take() -> Snapshot:
            return self.kubelet.device_manager.snapshot()

        return self.run(take)

    def wait_for_devices(self, predicate: Callable[[Snapshot], bool], timeout: float = 10.0) -> Snapshot:
        """Block until `predicate(snapshot)` holds; TimeoutError after `timeout` seconds."""
        return self.run(lambda: self.kubelet.device_manager.wait_for(predicate, timeout), timeout + 5)

    def wait_for_pod(
        self,
        namespace: str,
        name: str,
        timeout: float = 10.0,
        predicate: Callable[[AdmissionResult], bool] | None = None,
    ) -> AdmissionResult:
        """Block until pod namespace/name was admitted or rejected (a result for which `predicate`
        holds, when given); TimeoutError after `timeout`."""
        pods = self.kubelet.pods
        if pods is None:
            raise RuntimeError("this stand-in has no API server (no kubeconfig)")
        return self.run(lambda: pods.wait_for_result(namespace, name, timeout, predicate), timeout + 5)

    def wait_for_dra(self, predicate: Callable[[DraManager], bool], timeout: float = 10.0) -> None:
        """Block until `predicate(dra_manager)` holds (checked after every plugin or claim change);
        TimeoutError after `timeout`."""
        dra = self.kubelet.dra
        if dra is None:
            raise RuntimeError("the kubelet stand-in is not started")
        self.run(lambda: dra.wait_for(predicate, timeout), timeout + 5)

    def dra_checkpoint(self) -> list[ClaimInfoState]:
        """The claims in `dra_manager_state`."""
        return read_dra_checkpoint(self.config.dra_checkpoint_path)

    def containers(self) -> Containers:
        """What the runtime gave each started container (`containers.json`)."""
        return read_containers(self.config.containers_path)

    def restart(self, timeout: float = 30.0) -> None:
        self.run(self.kubelet.restart, timeout)

    def checkpoint(self) -> Checkpoint:
        return read_checkpoint(self.config.checkpoint_path)
