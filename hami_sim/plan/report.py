"""The planner's report: `report.json` (everything), `report.md` (the tables) and PNG charts (matplotlib,
the `plan` extra; without it the charts are skipped with a note in the report)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hami_control.frag import TaskMix
from hami_sim.plan import DEFAULT_EXTENDER_WEIGHT, DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE
from hami_sim.plan.experiments import MIB_PER_GIB, InflationResult, MemoryResult, ReplayResult

SATURATION = 100
"""The arrival (percent of capacity) at which unallocated GPUs are compared: the paper's point, where the
arrived GPU request equals the cluster's GPUs."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    nodes_file: str
    pods_file: str
    experiment: str
    seed: int
    gpus: int
    nodes: int
    tasks: int
    mix: str
    extender_weight: int = DEFAULT_EXTENDER_WEIGHT
    percentage_of_nodes_to_score: int | None = DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE


def at_arrival(result: InflationResult, percent: int) -> float | None:
    """Mean allocation share over the tasks whose arrival, rounded to a whole percent, is `percent` (the
    paper's analysis), else the last one before it; None when the run never got there."""
    arrived = np.round(np.asarray(result.arrived) * 100)
    alloc = np.asarray(result.allocation)
    at = alloc[arrived == percent]
    if len(at):
        return float(at.mean())
    before = np.flatnonzero(arrived < percent)
    if len(before) and len(before) < len(arrived):
        return float(alloc[before[-1]])
    return None


def inflation_summary(results: Sequence[InflationResult], gpus: int, steps: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in results:
        table = {}
        for p in steps:
            share = at_arrival(r, p)
            table[str(p)] = (
                None
                if share is None
                else {
                    "allocation_percent": round(100 * share, 3),
                    "unallocated_gpus": round((1 - share) * gpus, 1),
                }
            )
        sat = at_arrival(r, SATURATION)
        out[r.policy] = {
            "by_arrival_percent": table,
            "unallocated_gpus_at_saturation": None if sat is None else round((1 - sat) * gpus, 1),
            "allocation_percent_at_saturation": None if sat is None else round(100 * sat, 3),
            "failed_gpu_tasks": r.failed,
            "tasks": r.tasks,
            "seconds": round(r.seconds, 2),
            "fragmentation": {
                "arrived": [round(x, 4) for x in r.frag_arrived],
                "gpus": [round(x, 2) for x in r.frag_gpus],
            },
        }
    return out


def replay_summary(results: Sequence[ReplayResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in results:
        pend = np.asarray(r.pending_s, dtype=np.float64)
        waited = pend[pend > 0]
        quant = {
            f"p{q}": round(float(np.percentile(pend, q)), 1) if len(pend) else None for q in (50, 90, 99)
        }
        out[r.policy] = {
            "placed": len(pend),
            "waited": len(waited),
            "never_placed": r.never,
            "pending_s": {**quant, "max": round(float(pend.max()), 1) if len(pend) else None},
            "mean_fragmentation_gpus": round(float(np.mean(r.frag_gpus)), 2) if r.frag_gpus else None,
            "mean_allocation_percent": round(100 * float(np.mean(r.allocation)), 3) if r.allocation else None,
            "seconds": round(r.seconds, 2),
            "series": {
                "time_s": [round(t, 1) for t in r.times],
                "fragmentation_gpus": [round(x, 2) for x in r.frag_gpus],
                "allocation": [round(x, 5) for x in r.allocation],
            },
        }
    return out


def _markdown(info: RunInfo, summary: dict[str, Any], charts: Sequence[str], note: str) -> str:
    lines = [
        f"# Capacity plan: {info.experiment}",
        "",
        f"Nodes `{info.nodes_file}` ({info.nodes} nodes, {info.gpus} GPUs); pods `{info.pods_file}` "
        f"({info.tasks} tasks); seed {info.seed}; extender weight {info.extender_weight}; "
        f"percentage of nodes to score {info.percentage_of_nodes_to_score or 'adaptive'}.",
        f"Fragmentation measured against the task mix (most common shapes first): {info.mix}.",
        "",
    ]
    policies = list(summary)
    if info.experiment == "inflation":
        lines += [
            f"Unallocated GPUs when the arrived GPU request is {SATURATION}% of capacity:",
            "",
            "| policy | unallocated GPUs | allocation % | failed GPU tasks | seconds |",
            "|---|---|---|---|---|",
        ]
        for p in policies:
            s = summary[p]
            lines.append(
                f"| {p} | {s['unallocated_gpus_at_saturation']} | {s['allocation_percent_at_saturation']}"
                f" | {s['failed_gpu_tasks']} | {s['seconds']} |"
            )
        steps = list(summary[policies[0]]["by_arrival_percent"]) if policies else []
        lines += [
            "",
            "GPU allocation % by arrived GPU request (% of capacity):",
            "",
            "| arrived % | " + " | ".join(policies) + " |",
            "|---" * (len(policies) + 1) + "|",
        ]
        for step in steps:
            cells = []
            for p in policies:
                v = summary[p]["by_arrival_percent"][step]
                cells.append("-" if v is None else f"{v['allocation_percent']:.1f}")
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    else:
        lines += [
            "| policy | placed | waited | never placed | pending p50 s | p90 s | p99 s | max s "
            "| mean fragmentation (GPUs) | mean allocation % | seconds |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in policies:
            s = summary[p]
            q = s["pending_s"]
            lines.append(
                f"| {p} | {s['placed']} | {s['waited']} | {s['never_placed']} | {q['p50']} | {q['p90']} "
                f"| {q['p99']} | {q['max']} | {s['mean_fragmentation_gpus']} "
                f"| {s['mean_allocation_percent']} | {s['seconds']} |"
            )
    lines.append("")
    lines += [f"![{c}]({c})" for c in charts]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _charts(
    out: Path, info: RunInfo, results: Sequence[InflationResult] | Sequence[ReplayResult]
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)

    if info.experiment == "inflation":
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for r in results:
            assert isinstance(r, InflationResult)
            ax.plot(100 * np.asarray(r.arrived), 100 * np.asarray(r.allocation), label=r.policy, lw=1.4)
        ax.plot([0, 100], [0, 100], color="grey", lw=0.8, ls=":")
        ax.set_xlabel("arrived GPU request (% of capacity)")
        ax.set_ylabel("GPU allocation (% of capacity)")
        ax.set_title(f"Allocation as the workload grows ({info.gpus} GPUs)")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, "allocation.png")
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for r in results:
            assert isinstance(r, InflationResult)
            ax.plot(100 * np.asarray(r.frag_arrived), r.frag_gpus, label=r.policy, lw=1.4)
        ax.set_xlabel("arrived GPU request (% of capacity)")
        ax.set_ylabel("fragmentation (GPUs)")
        ax.set_title("Expected fragmentation for the workload's mix")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, "fragmentation.png")
        return names
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        assert isinstance(r, ReplayResult)
        ax.plot(np.asarray(r.times) / 3600, r.frag_gpus, label=r.policy, lw=1.2)
    ax.set_xlabel("trace time (hours)")
    ax.set_ylabel("fragmentation (GPUs)")
    ax.set_title("Fragmentation over time")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, "fragmentation.png")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    at_once = [float(np.mean(np.asarray(r.pending_s) <= 0)) for r in results if isinstance(r, ReplayResult)]
    for r in results:
        assert isinstance(r, ReplayResult)
        pend = np.sort(np.asarray(r.pending_s, dtype=np.float64))
        if len(pend):
            ax.step(
                np.maximum(pend, 1), np.arange(1, len(pend) + 1) / len(pend), where="post", label=r.policy
            )
    ax.set_xscale("log")
    if at_once and min(at_once) > 0.5:  # most pods placed at once: show the tail
        ax.set_ylim(max(0.0, min(at_once) - 0.02), 1.002)
    ax.set_xlabel("pending time (s, 1 = placed at once)")
    ax.set_ylabel("share of placed pods")
    ax.set_title("Pending time distribution")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, "pending.png")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        assert isinstance(r, ReplayResult)
        ax.plot(np.asarray(r.times) / 3600, 100 * np.asarray(r.allocation), label=r.policy, lw=1.2)
    ax.set_xlabel("trace time (hours)")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.set_title("Allocation over time")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, "allocation.png")
    return names


def describe_mix(mix: TaskMix, top: int = 8) -> str:
    """The mix in words: its most common shapes and their shares."""
    parts = []
    for shape, weight in list(zip(mix.shapes, mix.weights, strict=True))[:top]:
        gpu = f"{shape.gpus} GPUs" if shape.gpus > 1 else f"{shape.milli / 1000:g} GPU"
        host = f" + {shape.cpu_milli / 1000:g} CPU" if shape.cpu_milli else ""
        models = f" on {'|'.join(shape.models)}" if shape.models else ""
        parts.append(f"{gpu}{host}{models} {100 * weight:.1f}%")
    rest = len(mix.shapes) - top
    cpu = (
        f" (beside them, CPU-only tasks: {100 * mix.cpu_share:.1f}% of the typical tasks)"
        if mix.cpu_share
        else ""
    )
    return "; ".join(parts) + (f"; {rest} more shapes" if rest > 0 else "") + cpu


def write_report(
    out: Path,
    info: RunInfo,
    results: Sequence[InflationResult] | Sequence[ReplayResult],
    steps: Sequence[int] = tuple(range(0, 131, 10)),
    charts: bool = True,
) -> dict[str, Any]:
    """Write report.json, report.md and the charts into `out`; returns the JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    if info.experiment == "inflation":
        summary = inflation_summary([r for r in results if isinstance(r, InflationResult)], info.gpus, steps)
    else:
        summary = replay_summary([r for r in results if isinstance(r, ReplayResult)])
    names: list[str] = []
    note = ""
    if charts:
        try:
            names = _charts(out, info, results)
        except ImportError:
            note = "Charts skipped: matplotlib is not installed (pip install 'hami-py[plan]')."
    doc = {"run": _info(info), "policies": summary, "charts": names}
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "report.md").write_text(_markdown(info, summary, names, note))
    return doc


def _info(info: RunInfo) -> dict[str, Any]:
    return {k: getattr(info, k) for k in RunInfo.__slots__}


def _gib(mib: int) -> float:
    return round(mib / MIB_PER_GIB, 1)


def mig_summary(results: Sequence[MemoryResult]) -> dict[str, Any]:
    """Per side ("mig", "slices"): pods and GPU memory (GiB) at the end of the arrival."""
    out: dict[str, Any] = {}
    for r in results:
        out[r.mode] = {
            "policy": r.policy,
            "tasks_arrived": r.tasks,
            "placed": r.placed,
            "unplaced": r.unplaced,
            "capacity_gib": _gib(r.capacity_mib),
            "asked_gib": _gib(r.asked_mib),
            "allocated_gib": _gib(r.allocated_mib),
            "allocated_not_asked_gib": _gib(r.not_asked_mib),
            "unallocated_gib": _gib(r.unallocated_mib),
            "unallocated_percent": round(100 * r.unallocated_mib / max(r.capacity_mib, 1), 2),
            "profiles": dict(sorted(r.profiles.items())),
            "seconds": round(r.seconds, 2),
            "series": {
                "arrived": [round(x, 4) for x in r.arrived],
                "allocation": [round(x, 4) for x in r.allocation],
            },
        }
    return out


MIG_TABLE_HEADER = (
    "| mode | pods arrived | placed | unplaced | GPU memory asked by placed pods (GiB) | allocated (GiB) "
    "| allocated, not asked (GiB) | unallocated (GiB) | unallocated % |"
)


def mig_table_rows(summary: dict[str, Any]) -> list[str]:
    """The comparison's Markdown table (header, rule, one row per side)."""
    lines = [MIG_TABLE_HEADER, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, s in summary.items():
        lines.append(
            f"| {mode} | {s['tasks_arrived']} | {s['placed']} | {s['unplaced']} | {s['asked_gib']} "
            f"| {s['allocated_gib']} | {s['allocated_not_asked_gib']} | {s['unallocated_gib']} "
            f"| {s['unallocated_percent']} |"
        )
    return lines


def _mig_markdown(info: RunInfo, summary: dict[str, Any], charts: Sequence[str], note: str) -> str:
    first: dict[str, Any] = next(iter(summary.values()), {})
    lines = [
        "# Capacity plan: MIG against slices",
        "",
        f"Nodes `{info.nodes_file}` ({info.nodes} nodes, {info.gpus} GPUs, {first.get('capacity_gib')} GiB "
        f"of GPU memory); pods `{info.pods_file}` ({info.tasks} GPU tasks, as a memory-only workload); "
        f"seed {info.seed}; policy {first.get('policy')}.",
        "The same tasks in the same order arrive until the GPU memory they ask reaches the arrival limit; "
        "`mig`: every GPU in MIG mode (HAMi's dynamic MIG, the smallest profile holding the memory at a "
        "free placement), `slices`: hami-core slices of the memory asked.",
        "",
        *mig_table_rows(summary),
        "",
    ]
    if "mig" in summary:
        used = ", ".join(f"{k} x{v}" for k, v in summary["mig"]["profiles"].items())
        lines += [f"MIG profiles handed out: {used or 'none'}.", ""]
    lines += [f"![{c}]({c})" for c in charts]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def mig_chart(path: Path, results: Sequence[MemoryResult], title: str) -> None:
    """Two panels: allocated GPU memory against arrived (% of capacity) per side, and the pods placed
    and not, and the memory left unallocated and allocated but not asked, per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        left.plot(100 * np.asarray(r.arrived), 100 * np.asarray(r.allocation), label=r.mode, lw=1.4)
    left.plot([0, 100], [0, 100], color="grey", lw=0.8, ls=":")
    left.set_xlabel("GPU memory asked by arrived pods (% of capacity)")
    left.set_ylabel("GPU memory allocated (% of capacity)")
    left.set_title("Allocation as pods arrive")
    left.legend()
    left.grid(alpha=0.3)
    modes = [r.mode for r in results]
    x = np.arange(len(results))
    width = 0.2
    bars = (
        ("pods placed", [r.placed for r in results]),
        ("pods unplaced", [r.unplaced for r in results]),
        ("unallocated GiB", [r.unallocated_mib / MIB_PER_GIB for r in results]),
        ("allocated, not asked GiB", [r.not_asked_mib / MIB_PER_GIB for r in results]),
    )
    for k, (label, values) in enumerate(bars):
        drawn = right.bar(x + (k - 1.5) * width, values, width, label=label)
        right.bar_label(drawn, fmt="%.0f", fontsize=7)
    right.set_xticks(x, modes)
    right.set_title("At the end of the arrival")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_mig_report(
    out: Path, info: RunInfo, results: Sequence[MemoryResult], charts: bool = True
) -> dict[str, Any]:
    """Write report.json, report.md and mig-vs-slices.png of `mig_vs_slices` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    summary = mig_summary(results)
    names: list[str] = []
    note = ""
    if charts:
        try:
            mig_chart(out / "mig-vs-slices.png", results, f"MIG against slices ({info.gpus} GPUs)")
            names.append("mig-vs-slices.png")
        except ImportError:
            note = "Charts skipped: matplotlib is not installed (pip install 'hami-py[plan]')."
    doc = {"run": _info(info), "modes": summary, "charts": names}
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "report.md").write_text(_mig_markdown(info, summary, names, note))
    return doc


__all__ = [
    "MIG_TABLE_HEADER",
    "SATURATION",
    "RunInfo",
    "at_arrival",
    "describe_mix",
    "inflation_summary",
    "mig_chart",
    "mig_summary",
    "mig_table_rows",
    "replay_summary",
    "write_mig_report",
    "write_report",
]
