#!/usr/bin/env python3
"""Read-only MIG probe of a real GPU node through hami-node's NVML backend (issue 27).

Prints, per GPU: the MIG mode (current, pending), the GPU instance profiles with their real IDs, memory,
SMs and possible placements, and the MIG devices that exist. It only reads: it never enables or
disables MIG, creates or destroys an instance, or resets a GPU. Compare its output with the tables in
hami_api/mig.py (the H100/H200 placements there are inferred; this checks them).

Usage: python hack/mig_probe.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from hami_node.gpu import GPUBackendError
from hami_node.gpu.nvml import NvmlBackend


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON document instead of text")
    args = parser.parse_args()
    backend = NvmlBackend()
    try:
        backend.init()
    except GPUBackendError as exc:
        print(f"mig_probe: {exc}", file=sys.stderr)
        return 1
    report: list[dict[str, object]] = []
    try:
        for gpu in backend.list_gpus():
            entry: dict[str, object] = {"index": gpu.index, "uuid": gpu.uuid, "model": gpu.model}
            try:
                mode = backend.mig_mode(gpu.uuid)
                entry["mig_mode"] = {"current": mode.current, "pending": mode.pending}
                entry["profiles"] = [asdict(p) for p in backend.mig_profiles(gpu.uuid)]
                entry["devices"] = [asdict(d) for d in backend.mig_devices(gpu.uuid)]
            except GPUBackendError as exc:
                entry["error"] = str(exc)
            report.append(entry)
    finally:
        backend.shutdown()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for entry in report:
        print(f"GPU {entry['index']} {entry['uuid']} {entry['model']}: MIG {entry.get('mig_mode')}")
        if "error" in entry:
            print(f"  error: {entry['error']}")
            continue
        for p in entry["profiles"]:  # type: ignore[attr-defined]
            starts = ",".join(str(pl["start"]) for pl in p["placements"])
            size = p["placements"][0]["size"] if p["placements"] else "-"
            print(
                f"  {p['name']:<12} id {p['profile_id']:>2} enum {p['nvml_enum']:>2} x{p['instance_count']}"
                f" {p['memory_mib']} MiB {p['multiprocessors']} SM CE {p['copy_engines']} DEC {p['decoders']}"
                f" JPEG {p['jpeg_engines']} OFA {p['ofa_engines']} placements {{{starts}}}:{size}"
            )
        for d in entry["devices"]:  # type: ignore[attr-defined]
            print(
                f"  device {d['index']}: {d['uuid']} GI {d['gpu_instance_id']} CI {d['compute_instance_id']}"
                f" {d['profile']} at {d['placement']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
