"""Where the test suite's time goes, as Markdown tables: per folder and the slowest tests, set-up and
tear-down included, from the JUnit XML file pytest writes.

    ./hack/test.sh --junitxml=/tmp/suite.xml
    python hack/test_durations.py /tmp/suite.xml [--top 50]

Under xdist (hack/test.sh runs several workers) a test's time is its worker's wall time, so the sums are
worker-seconds: more than the run's wall time, and each test slower than alone when the workers share
the cores (docs/benchmarks.md, "The test suite")."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def durations(path: Path) -> list[tuple[str, float]]:
    """(node ID, seconds) of every test case in the file."""
    cases = []
    for case in ET.parse(path).iter("testcase"):
        module = (case.get("classname") or "").replace(".", "/")
        cases.append((f"{module}.py::{case.get('name')}", float(case.get("time") or 0.0)))
    return cases


def by_folder(cases: list[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    folders: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in cases:
        folders["/".join(nodeid.split("/")[:2])].append(seconds)
    return {folder: (len(times), sum(times)) for folder, times in folders.items()}


def render(cases: list[tuple[str, float]], top: int) -> str:
    lines = ["| folder | tests | seconds | share |", "|---|---:|---:|---:|"]
    folders = by_folder(cases)
    total = sum(seconds for _, seconds in folders.values()) or 1.0
    for folder, (count, seconds) in sorted(folders.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {folder} | {count:,} | {seconds:.1f} | {100 * seconds / total:.0f}% |")
    lines.append(f"| all | {len(cases):,} | {total:.1f} | 100% |")
    lines += ["", f"| the {top} slowest tests | seconds |", "|---|---:|"]
    for nodeid, seconds in sorted(cases, key=lambda c: -c[1])[:top]:
        lines.append(f"| `{nodeid}` | {seconds:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("junit_xml", type=Path, help="the file `pytest --junitxml=FILE` wrote")
    parser.add_argument("--top", type=int, default=50, help="how many of the slowest tests to list")
    args = parser.parse_args(argv)
    try:
        cases = durations(args.junit_xml)
    except (OSError, ET.ParseError) as exc:
        print(f"test_durations: {args.junit_xml}: {exc}", file=sys.stderr)
        return 2
    print(render(cases, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
