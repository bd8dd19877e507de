"""The GPU pair scores, `hami.io/node-nvidia-score`, on the Node: the reporter with the fake backend
against the local API server (HAMi's values, one patch with the inventory, a link edit followed, an
asymmetric pair scored 0 with one `AsymmetricGPUP2PLink` Event, unreadable links never holding up the
inventory), and `hami-node` as a process publishing them by default and not with the option off."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hami_api import annotations as ann
from hami_api.types import GPUInfo
from hami_kube.backoff import RetryPolicy
from hami_kube.errors import KubeApiError
from hami_kube.events import EventSource
from hami_node.gpu import TopologyLevel
from hami_node.gpu.fake import FakeBackend
from hami_node.gpu.inventory import Inventory, LinkGroup, generate_inventory, write_inventory
from hami_node.gpu.topology import read_pair_scores
from hami_node.kubeapi import NodeApi
from hami_node.reporter import ASYMMETRIC_LINK_MESSAGE, ASYMMETRIC_LINK_REASON, EVENT_SOURCE, NodeReporter
from tests.builders import node
from tests.conftest import ApiServerHandle
from tests.node_daemon_util import NodeRig, make_rig
from tests.waiting import wait_for, wait_node

NODE = "gpu-node-1"
FAST = RetryPolicy(initial=0.05, maximum=0.3)
DEADLINE = 10.0


def four_gpus(*links: LinkGroup) -> Inventory:
    """Four GPUs, NUMA 0, 0, 1, 1, with these links only."""
    return dataclasses.replace(generate_inventory(4, NODE, nvlink=False), links=links)


def linked() -> Inventory:
    """GPUs 0-1 under one PCIe switch, 1-2 joined by 4 NVLinks, the other pairs by NUMA node."""
    return four_gpus(LinkGroup((0, 1), level=TopologyLevel.SINGLE_SWITCH), LinkGroup((1, 2), nvlinks=4))


def register(inventory: Inventory) -> tuple[GPUInfo, ...]:
    return tuple(
        GPUInfo(id=g.uuid, index=g.index, count=10, devmem=g.memory_mib, devcore=100, type=g.model,
                numa=g.numa_node or 0, mode="hami-core", health=True)
        for g in inventory.gpus
    )  # fmt: skip


def expected_scores(uuids: list[str], table: Mapping[tuple[int, int], int]) -> str:
    """HAMi's JSON for a score table given by index pairs (both directions)."""
    entries = []
    for i, a in enumerate(uuids):
        peers = sorted((b, table[(min(i, j), max(i, j))]) for j, b in enumerate(uuids) if j != i)
        entries.append(f'{{"uuid":"{a}","score":{{' + ",".join(f'"{b}":{s}' for b, s in peers) + "}}")
    return "[" + ",".join(entries) + "]"


def node_annotations(core_v1: Any) -> dict[str, str]:
    return dict(core_v1.read_node(NODE).metadata.annotations or {})


def asymmetry_events(core_v1: Any) -> list[Any]:
    events = core_v1.list_namespaced_event("default").items
    return [e for e in events if e.reason == ASYMMETRIC_LINK_REASON]


@dataclasses.dataclass
class Rig:
    path: Path
    backend: FakeBackend
    kube: NodeApi
    reporter: NodeReporter

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.backend.inventory.gpus]

    def edit(self, inventory: Inventory) -> None:
        before = self.backend.reloads
        write_inventory(self.path, inventory)
        assert self.backend.wait_for_reload(before, DEADLINE)


@pytest.fixture
def rig(apiserver: ApiServerHandle, core_v1: Any, tmp_path: Path) -> Iterator[Rig]:
    core_v1.create_node(node(NODE))
    (tmp_path / "inv").mkdir()
    path = tmp_path / "inv" / "gpus.yaml"
    write_inventory(path, linked())
    backend = FakeBackend(path)
    backend.init()
    kube = NodeApi.connect(apiserver.kubeconfig)
    events = kube.event_recorder(NODE).with_source(EventSource(EVENT_SOURCE))
    reporter = NodeReporter(
        kube,
        NODE,
        check_interval_s=0.2,
        retry=FAST,
        topology=partial(read_pair_scores, backend),
        events=events,
    )
    reporter.start()
    try:
        yield Rig(path, backend, kube, reporter)
    finally:
        reporter.stop()
        kube.close()
        backend.shutdown()


LINKED_TABLE = {(0, 1): 50, (1, 2): 410, (0, 2): 10, (0, 3): 10, (1, 3): 10, (2, 3): 20}


def test_reporter_writes_hamis_pair_scores_with_the_inventory_in_one_patch(
    rig: Rig, apiserver: ApiServerHandle, core_v1: Any
) -> None:
    rig.reporter.publish(register(rig.backend.inventory))
    assert rig.reporter.wait_synced(DEADLINE)
    annotations = node_annotations(core_v1)
    assert annotations[ann.NODE_PAIR_SCORE] == expected_scores(rig.uuids, LINKED_TABLE)
    assert annotations[ann.NODE_REGISTER] == ann.encode_node_register(register(rig.backend.inventory))
    assert apiserver.runner.counters()[("patch", "nodes", "")] == 1
    # Steady: checked again and again, never rewritten.
    assert rig.reporter.wait_checks(rig.reporter.checks + 3, DEADLINE)
    assert apiserver.runner.counters()[("patch", "nodes", "")] == 1
    assert asymmetry_events(core_v1) == []


def test_reporter_follows_a_link_change_at_the_next_check(rig: Rig, core_v1: Any) -> None:
    rig.reporter.publish(register(rig.backend.inventory))
    assert rig.reporter.wait_synced(DEADLINE)
    rig.edit(dataclasses.replace(linked(), links=(*linked().links, LinkGroup((0, 3), nvlinks=12))))
    table = {**LINKED_TABLE, (0, 3): 1210}
    wait_for(
        lambda: node_annotations(core_v1).get(ann.NODE_PAIR_SCORE) == expected_scores(rig.uuids, table),
        DEADLINE,
        "the new score of GPUs 0 and 3",
    )
    # The patch is visible before the reporter counts it: wait for the count, then check it is one patch.
    wait_for(lambda: rig.reporter.writes >= 2, DEADLINE, "the reporter to count its second write")
    assert rig.reporter.writes == 2


def test_asymmetric_pair_scores_zero_and_raises_one_warning_event(rig: Rig, core_v1: Any) -> None:
    one_sided = LinkGroup((2, 3), nvlinks=4, reverse_nvlinks=0)
    rig.edit(dataclasses.replace(linked(), links=(*linked().links, one_sided)))
    rig.reporter.publish(register(rig.backend.inventory))
    assert rig.reporter.wait_synced(DEADLINE)
    table = {**LINKED_TABLE, (2, 3): 0}
    assert node_annotations(core_v1)[ann.NODE_PAIR_SCORE] == expected_scores(rig.uuids, table)
    wait_for(lambda: len(asymmetry_events(core_v1)) == 1, DEADLINE, "the AsymmetricGPUP2PLink Event")
    event = asymmetry_events(core_v1)[0]
    uid = core_v1.read_node(NODE).metadata.uid
    assert (event.type, event.involved_object.kind, event.involved_object.name) == ("Warning", "Node", NODE)
    assert event.involved_object.uid == uid and event.source.component == "hami-device-plugin"
    assert event.message.startswith(ASYMMETRIC_LINK_MESSAGE)
    assert f"{rig.uuids[2]} <-> {rig.uuids[3]}" in event.message
    # Reported once, not at every check.
    assert rig.reporter.wait_checks(rig.reporter.checks + 3, DEADLINE)
    assert len(asymmetry_events(core_v1)) == 1 and rig.reporter.events == 1
    # Mended, then broken again: a new Event.
    rig.edit(linked())
    wait_for(
        lambda: node_annotations(core_v1)[ann.NODE_PAIR_SCORE] == expected_scores(rig.uuids, LINKED_TABLE),
        DEADLINE,
        "the mended score",
    )
    rig.edit(dataclasses.replace(linked(), links=(*linked().links, one_sided)))
    # Reported again: the same Event counted twice (client-go's recorder patches the count of an
    # identical Event; HAMi's EmitNodeWarningEvent counts it too, within an hour).
    wait_for(
        lambda: [e.count for e in asymmetry_events(core_v1)] == [2],
        DEADLINE,
        "the AsymmetricGPUP2PLink Event counted a second time",
    )
    assert rig.reporter.events == 2


def test_unreadable_links_never_hold_up_the_inventory(rig: Rig, core_v1: Any) -> None:
    rig.backend.set_failing(True)
    rig.reporter.publish(register(rig.backend.inventory))
    assert rig.reporter.wait_synced(DEADLINE)
    assert ann.NODE_REGISTER in node_annotations(core_v1)
    assert ann.NODE_PAIR_SCORE not in node_annotations(core_v1)  # nothing read yet: nothing written
    rig.backend.set_failing(False)
    wait_for(
        lambda: (
            node_annotations(core_v1).get(ann.NODE_PAIR_SCORE) == expected_scores(rig.uuids, LINKED_TABLE)
        ),
        DEADLINE,
        "the scores once NVML answers",
    )
    rig.backend.set_failing(True)  # unreadable again: the last scores stay
    assert rig.reporter.wait_checks(rig.reporter.checks + 2, DEADLINE)
    assert node_annotations(core_v1)[ann.NODE_PAIR_SCORE] == expected_scores(rig.uuids, LINKED_TABLE)


def test_a_failing_link_reader_never_stops_the_inventory(apiserver: ApiServerHandle, core_v1: Any) -> None:
    core_v1.create_node(node(NODE))
    kube = NodeApi.connect(apiserver.kubeconfig)

    def broken(uuids: Any) -> Any:
        raise RuntimeError("a bug in a backend")

    reporter = NodeReporter(kube, NODE, check_interval_s=0.2, retry=FAST, topology=broken)
    reporter.start()
    try:
        reporter.publish(register(linked()))
        assert reporter.wait_synced(DEADLINE)
        assert reporter.wait_checks(reporter.checks + 2, DEADLINE)
        assert ann.NODE_REGISTER in node_annotations(core_v1)
        assert ann.NODE_PAIR_SCORE not in node_annotations(core_v1)
    finally:
        reporter.stop()
        kube.close()


class EventsRefused:
    """An event recorder that takes no Event (it raises, 403 as without the RBAC rule)."""

    def __init__(self) -> None:
        self.refused = 0

    def record(  # noqa: PLR0917
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, *, kind: str = "Pod"
    ) -> None:
        self.refused += 1
        raise KubeApiError(403, "Forbidden", "events is forbidden")


def test_a_refused_event_never_holds_up_the_annotations(rig: Rig, apiserver: ApiServerHandle) -> None:
    rig.edit(dataclasses.replace(linked(), links=(LinkGroup((0, 1), nvlinks=4, reverse_nvlinks=0),)))
    events = EventsRefused()
    kube = NodeApi.connect(apiserver.kubeconfig)
    reporter = NodeReporter(
        kube,
        NODE,
        check_interval_s=0.2,
        retry=FAST,
        topology=partial(read_pair_scores, rig.backend),
        events=events,
    )
    reporter.start()
    try:
        reporter.publish(register(rig.backend.inventory))
        assert reporter.wait_synced(DEADLINE)
        assert reporter.wait_checks(reporter.checks + 2, DEADLINE)
        assert events.refused >= 2 and reporter.events == 0  # tried again at each check
    finally:
        reporter.stop()
        kube.close()


def test_reporter_without_a_topology_reader_writes_no_scores(
    apiserver: ApiServerHandle, core_v1: Any
) -> None:
    core_v1.create_node(node(NODE))
    kube = NodeApi.connect(apiserver.kubeconfig)
    reporter = NodeReporter(kube, NODE, check_interval_s=0.2, retry=FAST)
    reporter.start()
    try:
        reporter.publish(register(linked()))
        assert reporter.wait_synced(DEADLINE)
        assert ann.NODE_REGISTER in node_annotations(core_v1)
        assert ann.NODE_PAIR_SCORE not in node_annotations(core_v1) and reporter.scores is None
    finally:
        reporter.stop()
        kube.close()


# --- hami-node as a process ----------------------------------------------------------------------


@pytest.fixture
def node_rig(apiserver: ApiServerHandle) -> Iterator[NodeRig]:
    yield from make_rig(NODE, apiserver.kubeconfig, linked())


def test_the_daemon_publishes_the_pair_scores_by_default(node_rig: NodeRig, core_v1: Any) -> None:
    node_rig.start_daemon()
    found = wait_node(core_v1, NODE, lambda n: ann.NODE_PAIR_SCORE in (n.metadata.annotations or {}))
    assert found.metadata.annotations[ann.NODE_PAIR_SCORE] == expected_scores(node_rig.uuids, LINKED_TABLE)


def test_the_daemon_publishes_no_pair_scores_with_the_option_off(node_rig: NodeRig, core_v1: Any) -> None:
    node_rig.start_daemon("--enable-topology-score=false")
    found = wait_node(core_v1, NODE, lambda n: ann.NODE_REGISTER in (n.metadata.annotations or {}))
    assert ann.NODE_PAIR_SCORE not in found.metadata.annotations
