"""hami_node.dra.prepare.ClaimPreparer on real files (CDI specs, claim directories, the checkpoint, the lock
file) with the claims and pods served from memory: Prepare reads before it locks, is idempotent across
restarts, never wipes a prepared claim's cache, and fails per claim; Unprepare cleans up by UID and
succeeds for a claim it does not know."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hami_kube.errors import KubeApiError
from hami_node.cdi import claim_spec_file_name
from hami_node.config import NodeConfig, load_config
from hami_node.devices import GPUStatus
from hami_node.dra import checkpoint as ckpt
from hami_node.dra.checkpoint import FILE_NAME as LEGACY_CHECKPOINT
from hami_node.dra.claims import ClaimRef
from hami_node.dra.prepare import LOCK_FILE, ClaimPreparer
from hami_node.dra.watched import WatchedPods
from tests.builders import Json, claim_refs, container, dra_result, physical_gpu, pod, resource_claim
from tests.cdi_util import spec_problems
from tests.waiting import wait_for

UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
POD_UID = "99999999-0000-4000-8000-000000000009"
GPUS = (GPUStatus(physical_gpu("GPU-0", 0)), GPUStatus(physical_gpu("GPU-1", 1)))


class Api:
    """Claims and pods by (namespace, name); records the reads and whether the lock was free then."""

    def __init__(self, preparer_dir: Path) -> None:
        self.objects: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self.reads: list[str] = []
        self.lock_dir = preparer_dir
        self.locked_during_read: list[bool] = []
        self.fail: dict[str, KubeApiError] = {}
        """Kind -> the error every read of that kind raises."""

    def add(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta.get("namespace", "default"), meta["name"])] = obj

    def _get(self, kind: str, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads.append(f"{kind} {namespace}/{name}")
        if kind in self.fail:
            raise self.fail[kind]
        try:
            return self.objects[(kind, namespace, name)]
        except KeyError:
            raise KubeApiError(404, "NotFound", f"{kind} {name} not found") from None

    def get_resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self._get("ResourceClaim", namespace, name)

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self._get("Pod", namespace, name)


@pytest.fixture
def config(tmp_path: Path) -> NodeConfig:
    return load_config(
        [
            "--node-name", "n1", "--mode", "dra",
            "--kubelet-plugins-dir", str(tmp_path / "plugins"),
            "--cdi-spec-dir", str(tmp_path / "cdi"),
            "--hook-path", str(tmp_path / "hook"),
        ],
        {},
        lambda p: "",
    )  # fmt: skip


def preparer_for(config: NodeConfig, api: Api) -> ClaimPreparer:
    preparer = ClaimPreparer(config, lambda: GPUS, api, common_nodes=lambda: ("/dev/nvidiactl",))
    preparer.start()
    return preparer


@pytest.fixture
def api(config: NodeConfig) -> Api:
    api = Api(config.dra_plugin_dir)
    api.add(
        resource_claim(
            "a", uid=UID_A, owner_pod=("p", POD_UID), reserved_for=[("p", POD_UID)],
            results=[dra_result("hami-gpu-1", share_id="s1", memory="4000Mi", cores="30")],
        )
    )  # fmt: skip
    api.add(
        pod(
            "p",
            container("main", resources=claim_refs("gpu")),
            namespace="default",
            uid=POD_UID,
            resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
            claim_statuses={"gpu": "a"},
        )
    )
    return api


A = ClaimRef("default", "a", UID_A)
B = ClaimRef("default", "b", UID_B)


def spec_of(config: NodeConfig, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((config.cdi_spec_dir / claim_spec_file_name(uid)).read_text())
    return data


def test_prepare_writes_the_spec_the_directory_and_the_checkpoint(config: NodeConfig, api: Api) -> None:
    preparer = preparer_for(config, api)
    outcome = preparer.prepare([A])[UID_A]
    assert outcome.error == "" and outcome.claim is not None
    (device,) = outcome.claim.devices
    assert (device.device, device.share_id, device.index, device.memory_mib, device.cores) == (
        "hami-gpu-1",
        "s1",
        0,
        4000,
        30,
    )
    spec = spec_of(config, UID_A)
    assert spec_problems(spec) == []
    assert spec["devices"][0]["containerEdits"]["env"][0] == "CUDA_DEVICE_MEMORY_LIMIT_0=4000m"
    directory = Path(config.hook_path) / "vgpu" / "claims" / UID_A
    assert directory.is_dir() and (directory.stat().st_mode & 0o777) == 0o777
    assert UID_A in ckpt.decode_journal(preparer.checkpoint_path.read_bytes()).claims
    assert preparer.checkpoint_path == config.dra_plugin_dir / "state" / "claims.journal"
    assert (config.dra_plugin_dir / LOCK_FILE).exists()
    assert api.reads == ["ResourceClaim default/a", "Pod default/p"]


def test_prepare_again_answers_the_same_and_keeps_the_shared_cache(config: NodeConfig, api: Api) -> None:
    first = preparer_for(config, api).prepare([A])[UID_A].claim
    cache = Path(config.hook_path) / "vgpu" / "claims" / UID_A / f"{UID_A}.cache"
    cache.write_bytes(b"in use by a running pod")
    restarted = preparer_for(config, api)  # a new daemon: the state comes from the checkpoint
    api.objects.clear()  # ... and the claim is read, but its allocation is not used again
    api.add(resource_claim("a", uid=UID_A, results=[dra_result("hami-gpu-0", memory="1Gi", cores="1")]))
    second = restarted.prepare([A])[UID_A].claim
    assert second == first
    assert cache.read_bytes() == b"in use by a running pod"
    assert restarted.prepared == 0


def test_a_claim_prepared_before_is_read_but_not_its_pods_and_one_unprepared_meanwhile_reads_them(
    config: NodeConfig, api: Api
) -> None:
    """Prepare again answers from the checkpoint, so it reads the claim (its UID checked) and not its
    pods; a claim this instance still thought prepared, which another instance unprepared meanwhile, is
    prepared anew once its pods are read."""
    ours, other = preparer_for(config, api), preparer_for(config, api)
    first = ours.prepare([A])[UID_A].claim
    api.reads.clear()
    assert ours.prepare([A])[UID_A].claim == first
    assert api.reads == ["ResourceClaim default/a"]
    assert other.unprepare([A]) == {UID_A: ""}
    api.reads.clear()
    assert ours.prepare([A])[UID_A].claim == first and ours.prepared == 2
    assert api.reads == ["ResourceClaim default/a", "Pod default/p"]
    assert (config.cdi_spec_dir / claim_spec_file_name(UID_A)).exists()


def test_a_prepared_claim_whose_spec_went_missing_gets_it_written_again(config: NodeConfig, api: Api) -> None:
    preparer = preparer_for(config, api)
    preparer.prepare([A])
    path = config.cdi_spec_dir / claim_spec_file_name(UID_A)
    before = path.read_bytes()
    path.unlink()  # a reboot empties /var/run/cdi
    assert preparer.prepare([A])[UID_A].error == ""
    assert path.read_bytes() == before


def test_each_claim_gets_its_own_error_and_the_others_are_prepared(config: NodeConfig, api: Api) -> None:
    api.add(resource_claim("b", uid=UID_B))  # not allocated
    missing = ClaimRef("default", "gone", "cccccccc-0000-4000-8000-000000000003")
    replaced = ClaimRef("default", "a", "dddddddd-0000-4000-8000-000000000004")
    out = preparer_for(config, api).prepare([A, B, missing, replaced])
    assert out[UID_A].claim is not None
    assert out[UID_B].error == "claim default/b is not allocated"
    assert out[missing.uid].error.startswith("claim default/gone: cannot read it: 404 NotFound")
    assert out[replaced.uid].error.startswith("claim default/a got replaced: its UID is")


def test_a_uid_that_is_not_a_kubernetes_uid_is_refused_before_any_file_is_touched(
    config: NodeConfig, api: Api
) -> None:
    bad = ClaimRef("default", "a", "../../etc")
    preparer = preparer_for(config, api)
    assert (
        preparer.prepare([bad])[bad.uid].error == "claim default/a: UID '../../etc' is not a Kubernetes UID"
    )
    assert preparer.unprepare([bad]) == {bad.uid: "claim default/a: UID '../../etc' is not a Kubernetes UID"}
    assert api.reads == []


def test_claims_are_read_before_the_lock_is_taken(config: NodeConfig, api: Api) -> None:
    preparer = preparer_for(config, api)
    held = threading.Event()
    release = threading.Event()
    original = preparer._prepare_locked

    def slow(*args: Any) -> Any:
        held.set()
        release.wait(10.0)
        return original(*args)

    preparer._prepare_locked = slow  # type: ignore[method-assign]
    first = threading.Thread(target=preparer.prepare, args=([A],))
    first.start()
    try:
        assert held.wait(10.0)
        reads = len(api.reads)
        second = threading.Thread(target=preparer.prepare, args=([A],))
        second.start()
        # The second call reads its claim while the first holds the lock.
        wait_for(
            lambda: len(api.reads) > reads,
            10.0,
            "the second Prepare to read its claim under the first's lock",
        )
    finally:
        release.set()
        first.join(10.0)
        second.join(10.0)


def second_claim_in_the_pods_container(api: Api) -> Json:
    """Claim `b` (on hami-gpu-0) beside `a`, both from templates and both used by the pod's one container:
    the pod that says so (not added to `api`)."""
    api.add(
        resource_claim(
            "b", uid=UID_B, owner_pod=("p", POD_UID), reserved_for=[("p", POD_UID)],
            results=[dra_result("hami-gpu-0", share_id="s0", memory="1Gi", cores="10")],
        )
    )  # fmt: skip
    templates = [
        {"name": "gpu", "resourceClaimTemplateName": "t"},
        {"name": "more", "resourceClaimTemplateName": "u"},
    ]
    return pod(
        "p",
        container("main", resources=claim_refs("gpu", "more")),
        namespace="default",
        uid=POD_UID,
        resourceClaims=templates,
        claim_statuses={"gpu": "a", "more": "b"},
    )


def test_two_claims_in_one_container_from_templates_get_agreeing_indices(
    config: NodeConfig, api: Api
) -> None:
    api.add(second_claim_in_the_pods_container(api))
    out = preparer_for(config, api).prepare([A, B])
    assert out[UID_A].claim is not None and out[UID_B].claim is not None
    assert out[UID_B].claim.devices[0].index == 0  # hami-gpu-0 first in PCI order
    assert out[UID_A].claim.devices[0].index == 1
    env_a = spec_of(config, UID_A)["devices"][0]["containerEdits"]["env"]
    assert env_a == ["CUDA_DEVICE_MEMORY_LIMIT_1=4000m", "CUDA_DEVICE_SM_LIMIT_1=30"]


def test_a_pod_that_cannot_be_read_fails_its_claim_and_one_that_is_gone_does_not(
    config: NodeConfig, api: Api
) -> None:
    api.fail["Pod"] = KubeApiError(503, "ServiceUnavailable", "try later")
    out = preparer_for(config, api).prepare([A])
    assert out[UID_A].error.startswith("claim default/a: cannot read pod default/p: 503 ServiceUnavailable")
    assert not (config.cdi_spec_dir / claim_spec_file_name(UID_A)).exists()
    del api.fail["Pod"]
    del api.objects[("Pod", "default", "p")]  # gone: the claim is prepared with its own indices
    assert preparer_for(config, api).prepare([A])[UID_A].claim is not None


def test_unprepare_removes_the_spec_the_directory_and_the_entry(config: NodeConfig, api: Api) -> None:
    preparer = preparer_for(config, api)
    preparer.prepare([A])
    assert preparer.unprepare([A]) == {UID_A: ""}
    assert not (config.cdi_spec_dir / claim_spec_file_name(UID_A)).exists()
    assert not (Path(config.hook_path) / "vgpu" / "claims" / UID_A).exists()
    assert ckpt.decode_journal(preparer.checkpoint_path.read_bytes()).claims == {}
    assert preparer.unprepared == 1


def test_unprepare_of_an_unknown_claim_succeeds_and_cleans_up_by_uid(config: NodeConfig, api: Api) -> None:
    preparer = preparer_for(config, api)
    assert preparer.unprepare([B]) == {UID_B: ""}
    # Files of a claim the checkpoint lost are found by the UID alone.
    (config.cdi_spec_dir).mkdir(parents=True, exist_ok=True)
    (config.cdi_spec_dir / claim_spec_file_name(UID_B)).write_text("{}")
    os.makedirs(Path(config.hook_path) / "vgpu" / "claims" / UID_B)
    assert preparer.unprepare([B]) == {UID_B: ""}
    assert not (config.cdi_spec_dir / claim_spec_file_name(UID_B)).exists()
    assert not (Path(config.hook_path) / "vgpu" / "claims" / UID_B).exists()


def test_a_corrupt_checkpoint_is_moved_aside_and_prepare_still_works(
    config: NodeConfig, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    config.dra_plugin_dir.mkdir(parents=True)
    legacy = config.dra_plugin_dir / LEGACY_CHECKPOINT
    legacy.write_text('{"kind": "HamiDraCheckpoint", "version": 1, "claims": {')
    preparer = preparer_for(config, api)
    assert (config.dra_plugin_dir / f"{LEGACY_CHECKPOINT}.bad").exists() and not legacy.exists()
    assert "cannot be used (not JSON" in caplog.text
    assert preparer.prepare([A])[UID_A].claim is not None


def test_a_journal_changed_before_its_last_record_is_reported_with_its_path_and_rebuilt_from_the_claims(
    config: NodeConfig, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal with a bad record followed by good ones was changed, not torn by a crash: it is never
    trusted; the error names the file and the reason, and the claim prepared again is read from the API
    server and gets what it got before, in a new journal."""
    preparer = preparer_for(config, api)
    first = preparer.prepare([A])[UID_A].claim
    assert first is not None and preparer.unprepare([A]) == {UID_A: ""}
    path = preparer.checkpoint_path
    header, put, delete = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(header + put.replace(b"hami-gpu-1", b"hami-gpu-0") + delete)
    again = preparer_for(config, api)
    assert (
        f"DRA checkpoint {path} cannot be used (record 1 at byte {len(header)}: CRC mismatch" in caplog.text
    )
    assert "with 1 more lines after it: the file was changed" in caplog.text
    assert path.with_name("claims.journal.bad").exists()
    assert again.prepare([A])[UID_A].claim == first
    assert ckpt.decode_journal(path.read_bytes()).claims.keys() == {UID_A}


def test_a_torn_last_record_is_ignored_with_its_reason_and_the_next_records_follow_the_good_ones(
    config: NodeConfig, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash during an append leaves part of a record (never answered: the answer waits for the sync):
    it is dropped with a warning, never a traceback, and cut off so the next record is readable."""
    preparer = preparer_for(config, api)
    prepared = preparer.prepare([A])[UID_A].claim
    assert prepared is not None
    path = preparer.checkpoint_path
    whole = path.read_bytes()
    torn = ckpt.encode_del(UID_A)
    path.write_bytes(whole + torn[: len(torn) // 2])
    restarted = preparer_for(config, api)
    assert "the last record was not written whole (record 2 at byte" in caplog.text
    assert "no end of line: the write was cut short" in caplog.text and "Traceback" not in caplog.text
    assert path.read_bytes() == whole and not path.with_name("claims.journal.bad").exists()
    assert restarted.prepare([A])[UID_A].claim == prepared  # still prepared: the del never completed
    assert restarted.unprepare([A]) == {UID_A: ""}
    assert preparer_for(config, api).prepare([B])[UID_B].error  # B is not allocated in this API
    assert ckpt.decode_journal(path.read_bytes()) == ckpt.Journal({}, len(path.read_bytes()), 2)


def test_a_version_1_checkpoint_left_by_an_earlier_hami_node_is_taken_over_at_start(
    config: NodeConfig, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    prepared = preparer_for(config, api).prepare([A])[UID_A].claim
    assert prepared is not None
    shutil.rmtree(config.dra_plugin_dir / "state")
    legacy = config.dra_plugin_dir / LEGACY_CHECKPOINT
    legacy.write_bytes(ckpt.encode(ckpt.Checkpoint({UID_A: prepared})))
    caplog.set_level(logging.INFO)
    api.reads.clear()
    preparer = preparer_for(config, api)
    assert f"took over 1 prepared claims from {legacy} (version 1)" in caplog.text
    assert not legacy.exists()
    assert ckpt.decode_journal(preparer.checkpoint_path.read_bytes()).claims == {UID_A: prepared}
    assert preparer.prepare([A])[UID_A].claim == prepared  # answered from the checkpoint
    assert preparer.unprepare([A]) == {UID_A: ""}
    assert not (config.cdi_spec_dir / claim_spec_file_name(UID_A)).exists()


def test_two_instances_share_the_journal_each_reading_what_the_other_appended_or_rewrote(
    config: NodeConfig, api: Api
) -> None:
    """A rolling update's two daemons: each call sees the other's records (read from where they start)
    and a journal the other wrote anew (read whole)."""
    old, new = preparer_for(config, api), preparer_for(config, api)
    prepared = old.prepare([A])[UID_A].claim
    assert prepared is not None
    api.reads.clear()
    assert new.prepare([A])[UID_A].claim == prepared and new.prepared == 0
    assert new.unprepare([A]) == {UID_A: ""}
    assert old.unprepare([A]) == {UID_A: ""} and old.unprepared == 0  # it knew the claim was gone
    for _ in range(ckpt.COMPACT_MIN_RECORDS // 2 + 1):  # old writes the journal anew once
        assert old.prepare([A])[UID_A].claim == prepared
        assert old.unprepare([A]) == {UID_A: ""}
    inode = old.checkpoint_path.stat().st_ino
    assert old.prepare([A])[UID_A].claim == prepared
    assert new.prepare([A])[UID_A].claim == prepared and new.prepared == 0
    assert old.checkpoint_path.stat().st_ino == inode
    old.close()
    new.close()


def test_the_journal_is_written_again_whole_once_its_records_outnumber_twice_the_claims(
    config: NodeConfig, api: Api
) -> None:
    preparer = preparer_for(config, api)
    path = preparer.checkpoint_path
    sizes = []
    for _ in range(ckpt.COMPACT_MIN_RECORDS):
        assert preparer.prepare([A])[UID_A].claim is not None
        assert preparer.unprepare([A]) == {UID_A: ""}
        sizes.append(path.stat().st_size)
    round_bytes = sizes[1] - sizes[0]  # A's put and its del
    assert max(sizes) == sizes[0] + (ckpt.COMPACT_MIN_RECORDS // 2 - 1) * round_bytes
    shrunk = [i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1]]
    assert shrunk == [ckpt.COMPACT_MIN_RECORDS // 2]  # the put past 64 records wrote it anew
    assert ckpt.decode_journal(path.read_bytes()).records <= ckpt.COMPACT_MIN_RECORDS


def test_interrupted_spec_writes_are_cleaned_at_start(config: NodeConfig, api: Api) -> None:
    config.cdi_spec_dir.mkdir(parents=True)
    leftover = config.cdi_spec_dir / f".{claim_spec_file_name(UID_A)}.x1y2.tmp"
    leftover.write_text("half")
    other = config.cdi_spec_dir / ".someone-else.json.tmp"
    other.write_text("theirs")
    preparer_for(config, api)
    assert not leftover.exists() and other.exists()


def test_without_rights_on_pods_claims_keep_their_own_indices_and_it_is_said_once(
    config: NodeConfig, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail["Pod"] = KubeApiError(403, "Forbidden", "pods is forbidden")
    preparer = preparer_for(config, api)
    assert preparer.prepare([A])[UID_A].claim is not None
    api.add(resource_claim("b", uid=UID_B, reserved_for=[("p", POD_UID)], results=[dra_result("hami-gpu-0")]))
    assert preparer.prepare([B])[UID_B].claim is not None
    assert caplog.text.count("grant get on pods to hami-node") == 1


# --- the pods of new claims from the node's pod watch (issue 29) -------------------------------------


def watched_preparer(config: NodeConfig, api: Api, pods: WatchedPods) -> ClaimPreparer:
    preparer = ClaimPreparer(config, lambda: GPUS, api, common_nodes=lambda: (), watched=pods)
    preparer.start()
    return preparer


def test_a_new_claims_pod_held_by_the_watch_with_the_reserved_uid_is_not_read(
    config: NodeConfig, api: Api
) -> None:
    """The pod from the watch is the one the indices come from: two claims in one container agree, as
    when the pod is read (test_two_claims_in_one_container_from_templates_get_agreeing_indices)."""
    both = second_claim_in_the_pods_container(api)
    del api.objects[("Pod", "default", "p")]  # a read would find it gone: its claims' own indices
    pods = WatchedPods()
    pods.pods_listed([both])
    preparer = watched_preparer(config, api, pods)
    out = preparer.prepare([A, B])
    assert out[UID_A].claim is not None and out[UID_B].claim is not None
    assert (out[UID_B].claim.devices[0].index, out[UID_A].claim.devices[0].index) == (0, 1)
    assert api.reads == ["ResourceClaim default/a", "ResourceClaim default/b"]
    assert (preparer.pods_watched, preparer.pods_read) == (1, 0)


def test_a_pod_the_watch_lacks_has_under_another_uid_or_has_not_listed_yet_is_read_as_without_it(
    config: NodeConfig, api: Api
) -> None:
    the_pod = api.objects[("Pod", "default", "p")]
    replaced = {**the_pod, "metadata": {**the_pod["metadata"], "uid": "77777777-0000-4000-8000-000000000007"}}
    cases = {
        "not listed yet": lambda pods: pods.pod_event("ADDED", the_pod),
        "absent": lambda pods: pods.pods_listed([]),
        "another uid": lambda pods: pods.pods_listed([replaced]),
    }
    for case, feed in cases.items():
        pods = WatchedPods()
        feed(pods)
        preparer = watched_preparer(config, api, pods)
        api.reads.clear()
        assert preparer.prepare([A])[UID_A].claim is not None, case
        assert api.reads == ["ResourceClaim default/a", "Pod default/p"], case
        assert (preparer.pods_watched, preparer.pods_read) == (0, 1), case
        assert preparer.unprepare([A]) == {UID_A: ""}


def test_a_pod_the_watch_lacks_fails_or_is_left_out_on_the_read_as_before(
    config: NodeConfig, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    pods = WatchedPods()
    pods.pods_listed([])
    preparer = watched_preparer(config, api, pods)
    api.fail["Pod"] = KubeApiError(503, "ServiceUnavailable", "try later")
    assert preparer.prepare([A])[UID_A].error.startswith("claim default/a: cannot read pod default/p: 503")
    api.fail["Pod"] = KubeApiError(403, "Forbidden", "pods is forbidden")
    assert preparer.prepare([A])[UID_A].claim is not None
    assert caplog.text.count("grant get on pods to hami-node") == 1
