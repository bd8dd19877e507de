#!/usr/bin/env bash
# The main job: the whole system on one machine. `hami-sim demo` brings up a local cluster (API server,
# hami-control with its webhook and scheduler extender, a kube-scheduler stand-in, and per node a kubelet
# stand-in plus a real hami-node on fake GPUs: 3 nodes x 4 GPUs of two models; an Ascend node and a Hygon
# node served by stand-ins for their vendors' plugins), applies the workloads in examples/demo/ and
# examples/demo-vendors/, shows where each pod landed (or why it was refused), the per-device usage and the
# environment HAMi-core receives, then tears everything down. About 10-15 s; the first run creates .venv
# with the package alone first (hack/setup.sh --demo: about 30 s on 2 cores; README, "Quick start").
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh --demo
. .venv/bin/activate
# The first run writes the bytecode of the modules the demo imports (setup installs without it), so later
# runs start faster, even where the environment says not to write it.
unset PYTHONDONTWRITEBYTECODE
exec hami-sim demo "$@"
