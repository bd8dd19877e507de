"""The chaos run's pure parts: the workload and the fault schedule are reproducible from their seed (and
differ between seeds), cover every kind they promise, stay within what the cluster can run, and the report
renders every figure in text and JSON."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest

from hami_sim.chaos.report import (
    ChaosReport,
    LatencySummary,
    LostPod,
    ViolationSummary,
    percentile,
)
from hami_sim.chaos.runner import OVERDUE_S, ChaosRun, PodTrack, asks_whole_gpus
from hami_sim.chaos.schedule import (
    ALL_KINDS,
    API_KINDS,
    TARGET_USER_AGENTS,
    ScheduleSpec,
    build_schedule,
    by_lane,
    schedule_data,
)
from hami_sim.chaos.workload import (
    KINDS,
    RUN_SECONDS,
    PodPlan,
    WorkloadSpec,
    build_workload,
    path_shape,
)
from hami_sim.progress import ProgressBar

A100 = ("NVIDIA A100-SXM4-80GB", 81920)
T4 = ("NVIDIA Tesla T4", 15360)
DP = path_shape([A100, T4, A100], ["GPU-dp-0", "GPU-dp-1"])
DRA = path_shape([A100, T4], ["GPU-dra-0", "GPU-dra-1"])
NODES = ("chaos-1", "chaos-2", "chaos-3", "chaos-4")


def workload_spec(seed: int = 1, mode: str = "mixed", pods: int = 2000) -> WorkloadSpec:
    return WorkloadSpec(
        pods, seed, mode, DP if mode != "dra" else None, DRA if mode != "device-plugin" else None
    )


def test_same_seed_gives_the_same_workload_and_another_seed_another() -> None:
    first, again, other = (build_workload(workload_spec(s)) for s in (7, 7, 8))
    assert first == again
    assert [p.body for p in first.pods] == [p.body for p in again.pods]
    assert [p.body for p in first.pods] != [p.body for p in other.pods]


def test_workload_has_every_kind_churn_bursts_quotas_and_a_dra_share() -> None:
    workload = build_workload(workload_spec())
    assert set(workload.kinds()) == set(KINDS)
    ends = Counter(p.end for p in workload.pods)
    assert ends["complete"] > 1000 and ends["delete"] > 400
    assert all((p.run_s is not None) == (p.end == "complete") for p in workload.pods)
    assert all(RUN_SECONDS in p.body["metadata"]["annotations"] for p in workload.pods if p.end == "complete")
    assert any(p.delete_after_s is not None and p.delete_after_s < 1.5 for p in workload.pods)
    assert 100 < sum(p.burst for p in workload.pods) < 1000
    paths = Counter(p.path for p in workload.pods)
    assert 0.2 < paths["dra"] / len(workload.pods) < 0.4
    namespaces = {n.name: n for n in workload.namespaces}
    assert all(namespaces[p.namespace].dra == (p.path == "dra") for p in workload.pods)
    quota = [p for p in workload.pods if namespaces[p.namespace].quota_mib is not None]
    assert quota and not any(p.kind == "percent" for p in quota)
    assert not any(p.kind == "percent" for p in workload.pods if p.path == "dra")
    manifests = namespaces["chaos-dra-quota"].manifests()
    assert manifests[0]["metadata"]["labels"] == {"hami.io/dra": "enabled"}
    assert manifests[1]["spec"]["hard"] == {"limits.nvidia.com/gpumem": str(workload_spec().quota_mib)}


def test_every_pod_fits_the_smallest_gpu_and_pins_only_what_its_path_has() -> None:
    for pod in build_workload(workload_spec(seed=3)).pods:
        shape = DRA if pod.path == "dra" else DP
        annotations = pod.body["metadata"]["annotations"]
        if "nvidia.com/use-gpuuuid" in annotations:
            assert annotations["nvidia.com/use-gpuuuid"] in shape.uuids
        if "nvidia.com/use-gputype" in annotations:
            assert annotations["nvidia.com/use-gputype"] in {m.match for m in shape.models}
        for c in pod.body["spec"].get("initContainers", []) + pod.body["spec"]["containers"]:
            limits = c["resources"]["limits"]
            assert int(limits.get("nvidia.com/gpumem", "0")) <= T4[1] // 2


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_single_path_modes_put_every_pod_on_that_path(mode: str) -> None:
    workload = build_workload(workload_spec(mode=mode, pods=300))
    assert {p.path for p in workload.pods} == {mode}


def test_model_pins_use_a_word_only_that_model_has() -> None:
    assert [m.match for m in DP.models] == ["A100", "T4"]


def test_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    spec = ScheduleSpec(5, 1000, NODES, 4, dra=True)
    first = build_schedule(spec)
    assert first == build_schedule(ScheduleSpec(5, 1000, NODES, 4, dra=True))
    assert schedule_data(first) == schedule_data(build_schedule(spec))
    assert schedule_data(first) != schedule_data(build_schedule(ScheduleSpec(6, 1000, NODES, 4, dra=True)))


def test_schedule_has_each_kind_in_its_lane_within_the_run() -> None:
    faults = build_schedule(ScheduleSpec(1, 10_000, NODES, 4, dra=True))
    counts = Counter(f.kind for f in faults)
    assert counts == dict.fromkeys(ALL_KINDS, 20)
    assert all(300 <= f.at_pod <= 9000 for f in faults)
    assert [f.at_pod for f in faults] == sorted(f.at_pod for f in faults)
    lanes = by_lane(faults)
    assert {f.kind for f in lanes["api"]} == set(API_KINDS)
    assert {f.kind for f in lanes["control"]} == {
        "kill-control-leader",
        "kill-control-follower",
        "kill-control-in-bind",
    }
    for fault in lanes["api"]:
        assert fault.rules and all(r["userAgents"] == list(TARGET_USER_AGENTS) for r in fault.rules)
    targets = {"kill-control-follower": "follower", "kill-control-leader": "leader",
               "kill-control-in-bind": "leader", "kill-scheduler": "scheduler",
               "kill-controller-manager": "controller-manager"}  # fmt: skip
    for fault in faults:
        if fault.kind in targets:
            assert fault.target == targets[fault.kind], fault
        elif fault.kind in ("kill-kubelet", "kill-hami-node"):
            assert fault.target in {f"{fault.kind.removeprefix('kill-')}/{n}" for n in NODES}
        elif fault.kind == "gpu-nvml":
            assert fault.target in NODES and fault.gpu is None
        elif fault.kind.startswith("gpu-"):
            assert fault.target in NODES and fault.gpu in range(4)


def test_schedule_without_dra_nodes_kills_no_controller_manager_and_honours_kinds() -> None:
    faults = build_schedule(ScheduleSpec(1, 400, NODES, 4, dra=False, per_kind=3))
    assert "kill-controller-manager" not in {f.kind for f in faults}
    assert len(faults) == 3 * (len(ALL_KINDS) - 1)
    only = build_schedule(ScheduleSpec(1, 400, NODES, 4, kinds=("gpu-xid",), per_kind=4))
    assert [f.kind for f in only] == ["gpu-xid"] * 4
    with pytest.raises(ValueError, match="unknown fault kind 'nope'"):
        ScheduleSpec(1, 400, NODES, 4, kinds=("nope",))


def test_percentile_by_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 99) == 5.0


def sample_report() -> ChaosReport:
    report = ChaosReport(seed=4, mode="mixed", nodes=6, gpus_per_node=4, pods_planned=200)
    report.pods_created, report.deleted, report.succeeded, report.running = 190, 50, 120, 19
    report.refused = {"GPU quota exceeded": 10}
    report.failed = {"UnexpectedAdmissionError": 1}
    report.faults = {"kill-control-leader": 2, "api-conflict": 2}
    report.api_injected = {"conflict": 17}
    report.add_violations(
        [
            ViolationSummary(
                "gpu-over-memory", f"chaos-1/GPU-{i}", "used 90000 of 81920 MiB", {"used": 1}, 3.0
            )
            for i in range(5)
        ]
    )
    report.running_with_faults = LatencySummary.of([1.0, 2.0, 9.0])
    report.running_without_faults = LatencySummary.of([0.5, 0.7])
    report.running_by_path = {"device-plugin": LatencySummary.of([1.0]), "dra": LatencySummary.of([2.0])}
    report.whole_gpu_by_path = {"dra": LatencySummary.of([4.0, 6.0])}
    report.lost = [
        LostPod("chaos-dp", "c00001-mem", "Pending", "Unschedulable: 0/6 nodes"),
        LostPod(
            "chaos-dra",
            "c00002-exclusive",
            "Pending",
            "Unschedulable",
            "nvidia",
            "dra",
            False,
            "no node had room",
        ),
    ]
    return report


def test_report_renders_every_figure_in_text_and_json() -> None:
    report = sample_report()
    assert not report.ok
    text = report.render_text()
    for expected in (
        "seed 4",
        "FAIL: 5 violations, 2 pods lost",
        "lost: 2 (0 with room for them at the end: real losses; 1 with none: waits)",
        "chaos-dra/c00002-exclusive [dra]: Pending: Unschedulable\n      a wait: no node had room",
        "refused at creation: GPU quota exceeded 10",
        "Failed (with a reason): UnexpectedAdmissionError 1",
        "chaos-dp/c00001-mem: Pending: Unschedulable: 0/6 nodes",
        "kill-control-leader        2",
        "the API server's count, by fault: conflict 17",
        "gpu-over-memory            5",
        "created while a fault was active: p50 2.00 s, p99 9.00 s, max 9.00 s (3 pods)",
        "created with no fault active:     p50 0.50 s, p99 0.70 s",
        "dra path:                         p50 2.00 s",
        "whole GPUs, dra:                  p50 4.00 s, p99 6.00 s",
    ):
        assert expected in text, expected
    assert text.count("[gpu-over-memory]") == 3  # the first few pieces of evidence, all counted
    data = json.loads(json.dumps(report.to_data()))
    assert data["ok"] is False and data["seed"] == 4
    assert data["violations"]["byKind"] == {"gpu-over-memory": 5}
    assert len(data["violations"]["evidence"]) == 3
    assert data["pods"]["lost"] == 2 and data["pods"]["refusedAtCreation"] == {"GPU quota exceeded": 10}
    assert data["pods"]["lostWaitingForRoom"] == 1 and data["pods"]["lostWithRoomAtEnd"] == 0
    assert data["pods"]["lostPods"][1]["roomAtEnd"] is False
    assert data["timeToRunning"]["wholeGpuByPath"]["dra"]["count"] == 2
    assert data["faults"]["total"] == 4 and data["faults"]["apiServerInjected"] == {"conflict": 17}
    assert data["timeToRunning"]["withFaults"]["p99Seconds"] == 9.0


def test_report_passes_with_no_violation_and_no_lost_pod() -> None:
    report = ChaosReport(seed=1, mode="dra", nodes=2, gpus_per_node=2, pods_planned=1)
    assert report.ok and "PASS: 0 violations, 0 pods lost" in report.render_text()


def test_progress_bar_writes_lines_off_a_terminal() -> None:
    out = io.StringIO()
    bar = ProgressBar(10, stream=out, width=10)
    bar.update(5, "live 3", force=True)
    bar.close()
    assert out.getvalue() == "[#####.....] 5/10 live 3\n"


def test_a_completing_pod_still_running_long_past_its_run_time_is_overdue_others_are_not() -> None:
    def track(end: str, run_s: float | None, running_at: float | None, kind: str = "mem") -> PodTrack:
        body = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpucores": "100"}}}]}}
        plan = PodPlan(1, "ns", "p", kind, "dra", end, run_s, None if end == "complete" else 5.0, False, body)
        return PodTrack(plan, created_at=0.0, running_at=running_at, phase="Running")

    now = 1000.0
    assert ChaosRun._overdue(track("complete", 5.0, now - 5.0 - OVERDUE_S - 1), now) is not None
    assert ChaosRun._overdue(track("complete", 5.0, now - 5.0 - OVERDUE_S + 1), now) is None
    assert ChaosRun._overdue(track("delete", None, 0.0), now) is None  # its delete came after the end
    assert asks_whole_gpus(track("complete", 5.0, 0.0).plan)  # all the cores of its GPU
    assert asks_whole_gpus(track("complete", 5.0, 0.0, kind="exclusive").plan)
