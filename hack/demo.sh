#!/usr/bin/env bash
# The main job: the whole system on one machine. `hami-sim demo` brings up a local cluster (API server,
# hami-control with its webhook and scheduler extender, a kube-scheduler stand-in, and per node a kubelet
# stand-in plus a real hami-node on fake GPUs: 3 nodes x 4 GPUs of two models; an Ascend node and a Hygon
# node served by stand-ins for their vendors' plugins), applies the workloads in examples/demo/ and
# examples/demo-vendors/, shows where each pod landed (or why it was refused), the per-device usage and the
# environment HAMi-core receives, then tears everything down. About 20-30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
. .venv/bin/activate
exec hami-sim demo "$@"
