"""Draw a preview of the Grafana dashboard (daemonset/components/monitoring/hami-dashboard.json) with
matplotlib, for docs/observability.md: no Grafana is needed.

The layout is the dashboard's own: every panel at its gridPos on Grafana's 24-column grid (rows 30 px
high), with its title, type (stat, gauge, bar gauge, time series, table), unit and legend formats. The
values are synthetic, drawn from a fixed seed for a made-up cluster of 4 nodes x 4 GPUs; the picture
says so in its header. It shows what each panel looks like, not a measurement.

    python hack/dashboard_preview.py [--out docs/images/dashboard.png]

matplotlib is not a dependency of hami-py: run it with a Python that has it (pip install matplotlib).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle, Wedge

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "daemonset" / "components" / "monitoring" / "hami-dashboard.json"
OUT = REPO / "docs" / "images" / "dashboard.png"

COL_PX, ROW_PX, WIDTH_PX, DPI = 66, 30, 24 * 66, 100
HEADER_PX = 60
BG, PANEL, GRID, TEXT, MUTED = "#111217", "#181b1f", "#2c3235", "#d8d9da", "#8e8e8e"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"]

# The made-up cluster the labels come from.
LABELS: dict[str, list[str]] = {
    "node": ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"],
    "device_index": ["0", "1", "2", "3"],
    "namespace": ["team-a", "team-a", "team-b"],
    "pod": ["train-0", "notebook-7", "infer-2"],
    "container": ["main", "jupyter", "server"],
    "vdevice_index": ["0", "0", "0"],
    "quota_name": ["nvidia.com/gpumem", "nvidia.com/gpumem", "nvidia.com/gpucores"],
    "reason": ["CardInsufficientMemory", "CardInsufficientCore", "NumaNotFit", "CardTypeMismatch"],
    "outcome": ["success", "no_fit", "conflict"],
    "allowed": ["true", "false"],
    "xid": ["79", "48"],
    "result": ["success", "failure"],
    "verb": ["patch", "get"],
    "code": ["409", "0"],
    "state": ["decoded", "refused"],
    "field": ["recent_kernel", "utilization_switch"],
}


LABELS_BY_METRIC: dict[str, dict[str, list[str]]] = {
    # hami-control's connection families: its replicas, and the reasons a limit closes a connection.
    "hami_control_connections_": {
        "pod": ["hami-control-5d8f7-abcde", "hami-control-5d8f7-fghij"],
        "reason": ["header_timeout", "tls_handshake_timeout", "evicted"],
    },
}
"""Labels that mean something else on some metrics than in `LABELS` (by metric name prefix)."""


def labels_for(expr: str) -> dict[str, list[str]]:
    for prefix, labels in LABELS_BY_METRIC.items():
        if prefix in expr:
            return {**LABELS, **labels}
    return LABELS


def legend_names(fmt: str, limit: int, labels: dict[str, list[str]] = LABELS) -> list[str]:
    """The legend of each synthetic series of a target: its legendFormat over the made-up labels."""
    keys = re.findall(r"\{\{(\w+)\}\}", fmt)
    if not keys:
        return [fmt or "value"]
    count = max(len(labels.get(k, ["x"])) for k in keys)
    if "node" in keys and "device_index" in keys:
        count = 16  # every GPU: node x index
    names = []
    for i in range(min(count, limit)):
        values = {
            k: (
                labels["node"][i // 4]
                if k == "node" and "device_index" in keys
                else labels["device_index"][i % 4]
                if k == "device_index"
                else labels.get(k, ["x"])[i % len(labels.get(k, ["x"]))]
            )
            for k in keys
        }
        names.append(re.sub(r"\{\{(\w+)\}\}", lambda m, values=values: values[m[1]], fmt))
    return names


def level(unit: str, title: str, legend: str, rng: random.Random) -> float:
    """A plausible level for a series in this unit."""
    if unit == "bytes":
        gib = 2**30
        if "capacity" in legend or "limit" in legend:
            return 16 * gib * (4 if "capacity" in legend else rng.choice([0.25, 0.5]))
        return rng.uniform(2, 9) * gib * (4 if legend == "allocated" else 1)
    if unit == "percentunit":
        return rng.uniform(0.35, 0.9)
    if unit == "percent":
        return 100 * rng.uniform(0.2, 0.8) if "allocated" not in legend else rng.choice([25, 50])
    if unit == "s":
        base = 0.0015 if "filter" in legend or "prioritize" in legend else 0.004
        return base * (1 if "p50" in legend else 3 if "p90" in legend else 6)
    if unit == "cps":  # connections a second: many accepted, a few dropped or refused
        return rng.uniform(0.005, 0.05) if legend.startswith(("dropped", "refused")) else rng.uniform(2, 6)
    if unit in ("reqps", "ops"):
        return rng.uniform(0.2, 3)
    if legend.startswith("cap "):
        return 1024
    if "connections" in title:
        return rng.uniform(20, 60)
    if "capacity" in legend:
        return 16
    if "allocated" in legend:
        return rng.uniform(6, 12)
    if "Slices" in title:
        return rng.choice([1, 2, 3])
    if "quota" in title:
        return rng.uniform(10, 60)
    if "region" in title:
        return 21 if legend == "decoded" else 0.5
    return rng.uniform(0.3, 3)  # events per interval: Xids, registrations, unhealthy GPUs


def fmt_value(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 2**30:.1f} GiB"
    if unit == "percentunit":
        return f"{100 * value:.0f}%"
    if unit == "percent":
        return f"{value:.0f}%"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.1f} s"
    if unit in ("reqps", "ops"):
        return f"{value:.1f}/s"
    if unit == "cps":
        return f"{value:.2g}/s"
    return f"{value:.3g}"


def draw_timeseries(ax: Any, panel: dict[str, Any], unit: str, rng: random.Random) -> None:
    t = [i / 4 for i in range(240)]  # an hour, every 15 s
    color = 0
    for target in panel["targets"]:
        for name in legend_names(target.get("legendFormat", ""), 6, labels_for(target.get("expr", ""))):
            base = level(unit, panel["title"], name, rng)
            flat = "capacity" in name or "limit" in name or name.startswith("cap ")
            phase, wobble, period = (
                rng.uniform(0, 6),
                0.0 if flat else rng.uniform(0.05, 0.2),
                rng.uniform(5, 12),
            )
            ys = [max(0.0, base * (1 + wobble * math.sin(phase + x / period))) for x in t]
            style = "--" if flat else "-"
            ax.plot(t, ys, style, lw=1.2, color=PALETTE[color % len(PALETTE)], label=name)
            color += 1
    ax.set_facecolor(PANEL)
    ax.tick_params(colors=MUTED, labelsize=6)
    ax.grid(color=GRID, lw=0.5)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xticks([0, 15, 30, 45, 60], ["-60m", "-45m", "-30m", "-15m", "now"])
    ax.yaxis.set_major_formatter(lambda v, _pos: fmt_value(v, unit))
    ax.set_ylim(bottom=0)
    ax.legend(
        loc="upper left", bbox_to_anchor=(0, -0.12), ncol=3, fontsize=5.5, frameon=False, labelcolor=TEXT
    )


def draw_stat(ax: Any, panel: dict[str, Any], unit: str, rng: random.Random) -> None:
    value = {"GPUs": 16, "Slices in use": 27, "Pods holding GPUs": 21, "Unregistered nodes": 0}.get(
        panel["title"], rng.uniform(1, 20)
    )
    ax.text(0.5, 0.42, fmt_value(value, unit), ha="center", va="center", fontsize=22, color="#73bf69")


def draw_gauge(ax: Any, unit: str, rng: random.Random) -> None:
    value = rng.uniform(0.45, 0.8)
    ax.set_xlim(-1.2, 1.2)
    ax.set_ylim(-0.35, 1.15)
    ax.set_aspect("equal")
    ax.add_patch(Wedge((0, 0), 1, 0, 180, width=0.22, color=GRID))
    ax.add_patch(Wedge((0, 0), 1, 180 - 180 * value, 180, width=0.22, color="#73bf69"))
    ax.text(0, 0.1, fmt_value(value, unit), ha="center", va="center", fontsize=14, color=TEXT)


def draw_bargauge(ax: Any, panel: dict[str, Any], unit: str, rng: random.Random) -> None:
    names = legend_names(panel["targets"][0].get("legendFormat", ""), limit=8)
    ax.set_xlim(0, 1.35)
    ax.set_ylim(len(names), -0.2)
    for i, name in enumerate(names):
        value = rng.uniform(0.3, 0.95)
        ax.text(0, i + 0.15, name, fontsize=6.5, color=TEXT, va="top")
        ax.add_patch(Rectangle((0, i + 0.4), 1, 0.4, color=GRID))
        ax.add_patch(Rectangle((0, i + 0.4), value, 0.4, color="#73bf69" if value < 0.85 else "#f2cc0c"))
        ax.text(1.03, i + 0.6, fmt_value(value, unit), fontsize=7, color=TEXT, va="center")


def draw_table(ax: Any, panel: dict[str, Any], rng: random.Random) -> None:
    header = ["namespace", "pod", "container", "device_uuid", "Value"]
    rows = [
        ["team-a", "notebook-7", "jupyter", "GPU-3f1c...", f"{rng.uniform(11, 50):.0f} min"],
        ["team-b", "infer-2", "server", "GPU-8a02...", f"{rng.uniform(11, 50):.0f} min"],
    ]
    for j, cell in enumerate(header):
        ax.text(0.02 + j * 0.2, 0.88, cell, fontsize=7, color=MUTED, weight="bold")
    for i, row in enumerate(rows):
        for j, cell in enumerate(row):
            ax.text(0.02 + j * 0.2, 0.72 - 0.14 * i, cell, fontsize=7, color=TEXT)


def render(dashboard: dict[str, Any], out: Path, seed: int = 17) -> None:
    rng = random.Random(seed)
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height_px = HEADER_PX + bottom * ROW_PX
    fig = plt.figure(figsize=(WIDTH_PX / DPI, height_px / DPI), dpi=DPI, facecolor=BG)

    def box(p: dict[str, Any], pad: float = 4) -> tuple[float, float, float, float]:
        g = p["gridPos"]
        x0, w = g["x"] * COL_PX + pad, g["w"] * COL_PX - 2 * pad
        y0, h = HEADER_PX + g["y"] * ROW_PX + pad, g["h"] * ROW_PX - 2 * pad
        return x0 / WIDTH_PX, 1 - (y0 + h) / height_px, w / WIDTH_PX, h / height_px

    variables = dashboard["templating"]["list"]
    fig.text(
        8 / WIDTH_PX,
        1 - 22 / height_px,
        f"{dashboard['title']}   (variables: {', '.join(v['name'] for v in variables)})",
        color=TEXT,
        fontsize=12,
        weight="bold",
        va="center",
    )
    fig.text(
        8 / WIDTH_PX,
        1 - 44 / height_px,
        "Preview drawn by hack/dashboard_preview.py from hami-dashboard.json: the layout, titles, units and "
        "legends are the dashboard's; the VALUES ARE SYNTHETIC (a made-up cluster of 4 nodes x 4 GPUs).",
        color="#f2cc0c",
        fontsize=8,
        va="center",
    )
    for p in panels:
        x, y, w, h = box(p)
        if p["type"] == "row":
            fig.text(x, y + h / 2, p["title"], color=TEXT, fontsize=10, weight="bold", va="center")
            continue
        frame = fig.add_axes((x, y, w, h))
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for side in frame.spines.values():
            side.set_color(GRID)
        title_h = 22 / height_px
        frame.text(0.01, 1 - (title_h / h) * 0.5, p["title"], transform=frame.transAxes, color=TEXT,
                   fontsize=8, weight="bold", va="center")  # fmt: skip
        unit = p["fieldConfig"]["defaults"].get("unit", "none")
        if p["type"] == "timeseries":
            inner = fig.add_axes((x + 60 / WIDTH_PX, y + 0.3 * h, w - 72 / WIDTH_PX, h - title_h - 0.34 * h))
            draw_timeseries(inner, p, unit, rng)
        else:
            inner = fig.add_axes((x, y, w, h - title_h))
            inner.set_axis_off()
            if p["type"] == "stat":
                draw_stat(inner, p, unit, rng)
            elif p["type"] == "gauge":
                draw_gauge(inner, unit, rng)
            elif p["type"] == "bargauge":
                draw_bargauge(inner, p, unit, rng)
            elif p["type"] == "table":
                draw_table(inner, p, rng)
            else:
                raise SystemExit(f"panel {p['title']!r}: no preview for type {p['type']!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, facecolor=BG, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    render(json.loads(args.dashboard.read_text(encoding="utf-8")), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
