#!/usr/bin/env bash
# A walk through one GPU node with fake GPUs, by hand (the main job is ./hack/demo.sh: hami-sim demo).
# Starts the local Kubernetes API server (hami-sim apiserver), a kubelet stand-in and the real node
# daemon (hami-node, fake backend: 4 x A100), then walks one GPU pod through what the scheduler and
# kubelet do, and shows a GPU failing and coming back. Everything it starts is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
. .venv/bin/activate

state=.hami-sim
mkdir -p "$state/logs"
kubeconfig="$state/kubeconfig"
rm -f "$kubeconfig"
run=$(mktemp -d /tmp/hami-demo.XXXXXX)   # short paths: Unix socket names are limited to 107 bytes
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
k() { echo "\$ kubectl $*"; kubectl --kubeconfig "$kubeconfig" "$@"; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll a condition (a demo, not a test)
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "timed out waiting for $what; logs in $state/logs" >&2
      exit 1
    fi
    sleep 0.2
  done
}

step "Start the local API server, a kubelet stand-in and hami-node (fake backend, 4 x A100)"
hami-sim apiserver --port 0 --kubeconfig-out "$kubeconfig" >"$state/logs/apiserver.log" 2>&1 &
pids+=($!)
wait_for 15 "the API server" test -s "$kubeconfig"
python - "$run/gpus.yaml" <<'EOF'
import sys
from pathlib import Path
from hami_node.gpu.inventory import generate_inventory, write_inventory
write_inventory(Path(sys.argv[1]), generate_inventory(4, "gpu-node-1"))
EOF
hami-sim kubelet --node-name gpu-node-1 --dir "$run/dp" --kubeconfig "$kubeconfig" --create-node \
  >"$state/logs/kubelet.log" 2>&1 &
pids+=($!)
hami-node --node-name gpu-node-1 --kubelet-dir "$run/dp" --kubeconfig "$kubeconfig" \
  --gpu-backend fake --fake-inventory "$run/gpus.yaml" --hook-path "$run/hook" \
  --health-recovery-seconds 3 >"$state/logs/hami-node.log" 2>&1 &
pids+=($!)
allocatable() { kubectl --kubeconfig "$kubeconfig" get node gpu-node-1 \
  -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null; }
gpus_are() { [ "$(allocatable)" = "$1" ]; }
has_inventory() { [ -n "$(kubectl --kubeconfig "$kubeconfig" get node gpu-node-1 \
  -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}')" ]; }
wait_for 30 "nvidia.com/gpu on the node" gpus_are 40
wait_for 10 "the inventory annotation" has_inventory
k get nodes -o wide

step "The node daemon advertised 4 GPUs x 10 slices and wrote HAMi's inventory annotation"
show_inventory() {
  kubectl --kubeconfig "$kubeconfig" get node gpu-node-1 -o json >"$run/node.json"
  python - "$run/node.json" <<'EOF'
import json, sys
from hami_api.annotations import NODE_REGISTER, decode_node_register
node = json.load(open(sys.argv[1]))
print("allocatable nvidia.com/gpu:", node["status"]["allocatable"]["nvidia.com/gpu"])
print(f"{'GPU':<42} {'model':<22} {'MiB':>6} {'slices':>6} {'numa':>4}  health")
for gpu in decode_node_register(node["metadata"]["annotations"][NODE_REGISTER]):
    health = "ok" if gpu.health else "UNHEALTHY"
    print(f"{gpu.id:<42} {gpu.type:<22} {gpu.devmem:>6} {gpu.count:>6} {gpu.numa:>4}  {health}")
EOF
}
show_inventory

step "A pod asks for a slice of one GPU: 4000 MiB and 30 % of its SMs"
k create -f examples/pod-inference.yaml
gpu=$(python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["gpus"][1]["uuid"])' "$run/gpus.yaml")
echo
echo "The scheduler extender (next issue) binds it with its choice in the Binding's annotations;"
echo "here we send the same Binding by hand, choosing GPU $gpu:"
cat >"$run/binding.yaml" <<EOF
apiVersion: v1
kind: Binding
metadata:
  name: inference-small
  annotations:
    hami.io/vgpu-devices-to-allocate: "$gpu,NVIDIA,4000,30:;"
    hami.io/vgpu-devices-allocated: "$gpu,NVIDIA,4000,30:;"
    hami.io/vgpu-node: gpu-node-1
    hami.io/bind-phase: allocating
    hami.io/bind-time: "$(date +%s)"
target: {apiVersion: v1, kind: Node, name: gpu-node-1}
EOF
k create --validate=false -f "$run/binding.yaml"   # the stand-in publishes no OpenAPI schema for Binding
running() { [ "$(kubectl --kubeconfig "$kubeconfig" get pod inference-small -o jsonpath='{.status.phase}')" = Running ]; }
wait_for 20 "the pod to run" running
k get pods -o wide
k get pod inference-small -o jsonpath='hami.io/bind-phase={.metadata.annotations.hami\.io/bind-phase}{"\n"}'

step "What the container received from Allocate (read back from kubelet's checkpoint)"
python - "$run/dp/kubelet_internal_checkpoint" <<'EOF'
import sys
from hami_sim.kubelet import read_checkpoint
for entry in read_checkpoint(sys.argv[1]).entries:
    print(f"container {entry.container_name}:")
    for key, value in sorted(entry.response.envs.items()):
        print(f"  env   {key}={value}")
    for m in entry.response.mounts:
        print(f"  mount {m.container_path} <- {m.host_path} ({'ro' if m.read_only else 'rw'})")
EOF

step "GPU 0 reports Xid 79 (fallen off the bus): its slices go Unhealthy"
python - "$run/gpus.yaml" <<'EOF'
import os, sys, yaml
path = sys.argv[1]
inventory = yaml.safe_load(open(path))
inventory["events"] = [{"id": "demo-xid-79", "gpu": 0, "kind": "xid", "xid": 79}]
open(path + ".new", "w").write(yaml.safe_dump(inventory, sort_keys=False))
os.replace(path + ".new", path)  # write-then-rename: the daemon never reads half a file
EOF
wait_for 10 "the GPU to be fenced" gpus_are 30
show_inventory
echo
echo "It stays quiet and answers NVML for 3 s (--health-recovery-seconds 3), so it comes back:"
wait_for 30 "the GPU to recover" gpus_are 40
show_inventory

step "Done"
echo "Logs: $state/logs/. Everything started here stops now."
