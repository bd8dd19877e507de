"""The chaos run's report (text and JSON), pure (its progress bar is `hami_sim.progress`).

`ChaosReport` holds what a run found: pods (planned, created, refused at creation, deleted by the run,
Succeeded, Running, Failed with their reasons, lost), faults injected by kind (the runner's and the API
server's own counters from `GET /hami-sim/faults`), the checker's violations by kind with the first
pieces of evidence of each, time to Running p50/p99 for pods created with and without a fault active,
the duration and the seed. `render_text()` is what `hami-sim chaos` prints, `to_data()` its `--json`.

A pod is lost when it was created, not deleted by the run, and at the end is neither Running nor
Succeeded nor Failed with a reason a person can act on (`status.reason`/`message`).

With nodes of other vendors the report also counts the pods and the violations per vendor (`nvidia` for
NVIDIA GPUs; a violation's vendor is its evidence's `vendor`, else `nvidia`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

EVIDENCE_PER_KIND = 3
"""Violations shown per kind in the report (all are counted)."""
LOST_SHOWN = 20


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencySummary:
        return cls(
            len(values), percentile(values, 50), percentile(values, 99), max(values) if values else None
        )

    def to_data(self) -> dict[str, Any]:
        return {"count": self.count, "p50Seconds": _r(self.p50_s), "p99Seconds": _r(self.p99_s),
                "maxSeconds": _r(self.max_s)}  # fmt: skip

    def text(self) -> str:
        if not self.count:
            return "no pods"
        return f"p50 {self.p50_s:.2f} s, p99 {self.p99_s:.2f} s, max {self.max_s:.2f} s ({self.count} pods)"


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class ViolationSummary:
    kind: str
    subject: str
    message: str
    evidence: Mapping[str, Any]
    at_s: float
    """Seconds since the run started."""

    def to_data(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "message": self.message,
                "evidence": dict(self.evidence), "atSeconds": round(self.at_s, 2)}  # fmt: skip


@dataclass(frozen=True)
class LostPod:
    namespace: str
    name: str
    phase: str
    why: str
    vendor: str = "nvidia"
    """Whose devices it asked."""
    path: str = ""
    """device-plugin or dra."""
    room: bool | None = None
    """Whether the cluster had room for it at the end (`hami_sim.chaos.capacity`): True, a real loss;
    False, a wait (the cluster was full for what it asks); None, not known."""
    room_detail: str = ""

    def to_data(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "phase": self.phase, "why": self.why,
                "vendor": self.vendor, "path": self.path, "roomAtEnd": self.room,
                "roomDetail": self.room_detail}  # fmt: skip

    @property
    def verdict(self) -> str:
        if self.room is None:
            return "room at the end not known"
        return "a real loss: " if self.room else "a wait: "


VENDOR_COUNTS = ("created", "refused", "deleted", "succeeded", "running", "failed", "lost")
"""What `ChaosReport.by_vendor` counts for each vendor's pods."""


@dataclass
class ChaosReport:
    seed: int
    mode: str
    nodes: int
    gpus_per_node: int
    pods_planned: int
    duration_s: float = 0.0
    cluster_up_s: float = 0.0
    pods_created: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Pods the API server refused at creation (quota), by reason (first words of the message)."""
    create_retries: int = 0
    """Creates sent again after a transient refusal (hami-control's webhook unreachable mid-restart)."""
    deleted: int = 0
    succeeded: int = 0
    running: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    """Pods Failed at the end, by their status reason."""
    lost: list[LostPod] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    """Faults the runner injected, by kind."""
    fault_errors: list[str] = field(default_factory=list)
    """Faults the runner could not inject or recover from (each a line)."""
    api_injected: dict[str, int] = field(default_factory=dict)
    """The API server's own count of injected faults, by fault (summed over the windows)."""
    violations: dict[str, int] = field(default_factory=dict)
    evidence: list[ViolationSummary] = field(default_factory=list)
    """The first `EVIDENCE_PER_KIND` violations of each kind."""
    running_with_faults: LatencySummary = field(default_factory=lambda: LatencySummary.of(()))
    running_without_faults: LatencySummary = field(default_factory=lambda: LatencySummary.of(()))
    running_by_path: dict[str, LatencySummary] = field(default_factory=dict)
    """Time to Running of every pod, per path (device-plugin, dra)."""
    whole_gpu_by_path: dict[str, LatencySummary] = field(default_factory=dict)
    """Time to Running of the pods that ask whole GPUs (a GPU alone or all its cores), per path."""
    checker_passes: int = 0
    notes: list[str] = field(default_factory=list)
    vendors: list[str] = field(default_factory=list)
    """The other vendors the run had nodes of (as `--vendors` names them)."""
    vendor_nodes: int = 0
    by_vendor: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per vendor, its pods by outcome (`VENDOR_COUNTS`)."""
    violations_by_vendor: dict[str, int] = field(default_factory=dict)

    def count_vendor(self, vendor: str, outcome: str) -> None:
        counts = self.by_vendor.setdefault(vendor, dict.fromkeys(VENDOR_COUNTS, 0))
        counts[outcome] = counts.get(outcome, 0) + 1

    @property
    def violation_count(self) -> int:
        return sum(self.violations.values())

    @property
    def ok(self) -> bool:
        return self.violation_count == 0 and not self.lost

    def add_violations(self, found: Sequence[ViolationSummary]) -> None:
        for v in found:
            seen = self.violations.get(v.kind, 0)
            self.violations[v.kind] = seen + 1
            vendor = str(v.evidence.get("vendor") or "nvidia")
            self.violations_by_vendor[vendor] = self.violations_by_vendor.get(vendor, 0) + 1
            if seen < EVIDENCE_PER_KIND:
                self.evidence.append(v)

    def to_data(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seed": self.seed,
            "mode": self.mode,
            "nodes": self.nodes,
            "gpusPerNode": self.gpus_per_node,
            "vendors": list(self.vendors),
            "vendorNodes": self.vendor_nodes,
            "durationSeconds": round(self.duration_s, 1),
            "clusterUpSeconds": round(self.cluster_up_s, 1),
            "pods": {
                "planned": self.pods_planned,
                "created": self.pods_created,
                "refusedAtCreation": dict(sorted(self.refused.items())),
                "createRetries": self.create_retries,
                "deletedByRun": self.deleted,
                "succeeded": self.succeeded,
                "running": self.running,
                "failed": dict(sorted(self.failed.items())),
                "lost": len(self.lost),
                "lostWithRoomAtEnd": sum(p.room is True for p in self.lost),
                "lostWaitingForRoom": sum(p.room is False for p in self.lost),
                "lostPods": [p.to_data() for p in self.lost],
                "byVendor": {v: dict(c) for v, c in sorted(self.by_vendor.items())},
            },
            "faults": {
                "injected": dict(sorted(self.faults.items())),
                "total": sum(self.faults.values()),
                "apiServerInjected": dict(sorted(self.api_injected.items())),
                "errors": list(self.fault_errors),
            },
            "violations": {
                "total": self.violation_count,
                "byKind": dict(sorted(self.violations.items())),
                "byVendor": dict(sorted(self.violations_by_vendor.items())),
                "evidence": [v.to_data() for v in self.evidence],
                "checkerPasses": self.checker_passes,
            },
            "timeToRunning": {
                "withFaults": self.running_with_faults.to_data(),
                "withoutFaults": self.running_without_faults.to_data(),
                "byPath": {p: s.to_data() for p, s in sorted(self.running_by_path.items())},
                "wholeGpuByPath": {p: s.to_data() for p, s in sorted(self.whole_gpu_by_path.items())},
            },
            "notes": list(self.notes),
        }

    def render_text(self) -> str:
        lines = [
            f"== hami-sim chaos: seed {self.seed}, mode {self.mode}, {self.nodes} nodes x "
            f"{self.gpus_per_node} GPUs{self._vendors_text()}, {self.duration_s:.0f} s "
            f"(cluster up in {self.cluster_up_s:.0f} s)",
            f"result: {'PASS' if self.ok else 'FAIL'}: {self.violation_count} violations, "
            f"{len(self.lost)} pods lost",
            "",
            "pods",
            f"  planned {self.pods_planned}, created {self.pods_created}, deleted by the run {self.deleted}, "
            f"Succeeded {self.succeeded}, Running {self.running}",
        ]
        if self.refused:
            lines.append("  refused at creation: " + _counts(self.refused))
        if self.create_retries:
            lines.append(f"  creates retried after a transient refusal: {self.create_retries}")
        if self.failed:
            lines.append("  Failed (with a reason): " + _counts(self.failed))
        lost = f"  lost: {len(self.lost)}"
        if self.lost:
            real = sum(p.room is True for p in self.lost)
            waits = sum(p.room is False for p in self.lost)
            lost += f" ({real} with room for them at the end: real losses; {waits} with none: waits)"
        lines.append(lost)
        for pod in self.lost[:LOST_SHOWN]:
            vendor = f" ({pod.vendor})" if self.vendors else ""
            path = f" [{pod.path}]" if pod.path else ""
            lines.append(f"    {pod.namespace}/{pod.name}{vendor}{path}: {pod.phase}: {pod.why}")
            if pod.room is not None:
                lines.append(f"      {pod.verdict}{pod.room_detail}")
        if len(self.lost) > LOST_SHOWN:
            lines.append(f"    ... and {len(self.lost) - LOST_SHOWN} more (see the JSON report)")
        lines += ["", f"faults injected: {sum(self.faults.values())}"]
        lines += [f"  {kind:<26} {count}" for kind, count in sorted(self.faults.items())]
        if self.api_injected:
            lines.append("  the API server's count, by fault: " + _counts(self.api_injected))
        for error in self.fault_errors:
            lines.append(f"  not injected: {error}")
        lines += ["", f"violations: {self.violation_count} (checker passes: {self.checker_passes})"]
        lines += [f"  {kind:<26} {count}" for kind, count in sorted(self.violations.items())]
        if self.vendors and self.violations_by_vendor:
            lines.append("  by vendor: " + _counts(self.violations_by_vendor))
        for v in self.evidence:
            lines.append(f"  - [{v.kind}] {v.subject} at {v.at_s:.1f} s: {v.message}")
            if v.evidence:
                lines.append(f"      evidence: {_short(v.evidence)}")
        lines += [
            "",
            "time to Running (creation -> Running)",
            f"  created while a fault was active: {self.running_with_faults.text()}",
            f"  created with no fault active:     {self.running_without_faults.text()}",
        ]
        for path, summary in sorted(self.running_by_path.items()):
            lines.append(f"  {path + ' path:':<34}{summary.text()}")
        for path, summary in sorted(self.whole_gpu_by_path.items()):
            lines.append(f"  {'whole GPUs, ' + path + ':':<34}{summary.text()}")
        if self.vendors:
            lines += ["", "pods by vendor"]
            for vendor, counts in sorted(self.by_vendor.items()):
                shown = {k: v for k, v in counts.items() if v}
                lines.append(f"  {vendor:<12} " + ", ".join(f"{k} {v}" for k, v in shown.items()))
        if self.notes:
            lines += ["", "notes"] + [f"  {n}" for n in self.notes]
        return "\n".join(lines)

    def _vendors_text(self) -> str:
        if not self.vendors:
            return ""
        return f" + {self.vendor_nodes} nodes of {', '.join(self.vendors)}"


def _counts(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(values.items()))


def _short(evidence: Mapping[str, Any], limit: int = 400) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in evidence.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "VENDOR_COUNTS",
    "ChaosReport",
    "LatencySummary",
    "LostPod",
    "ViolationSummary",
    "percentile",
]
