#!/usr/bin/env bash
# The main job, until the local cluster lands: start the local Kubernetes API server (hami-sim
# apiserver), load two GPU nodes into it with kubectl, and show them as a cluster admin would.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
. .venv/bin/activate

state=.hami-sim
mkdir -p "$state/logs"
kubeconfig="$state/kubeconfig"
rm -f "$kubeconfig"
hami-sim apiserver --port 0 --kubeconfig-out "$kubeconfig" >"$state/logs/apiserver.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do   # up to 10 s for the server to write its kubeconfig
  [ -s "$kubeconfig" ] && break
  kill -0 "$server" 2>/dev/null || { echo "apiserver failed to start:" >&2; cat "$state/logs/apiserver.log" >&2; exit 1; }
  sleep 0.1
done
[ -s "$kubeconfig" ] || { echo "apiserver did not become ready in 10 s" >&2; exit 1; }

k() { echo "\$ kubectl $*"; kubectl --kubeconfig "$kubeconfig" "$@"; echo; }
k version
k create -f examples/sim-nodes.yaml
k get nodes -o wide
k label node gpu-node-2 hami.io/demo=yes
k get nodes -l hami.io/demo=yes
k get node gpu-node-1 -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}'
echo
k create -f examples/pod-inference.yaml
k get pods -o wide
echo "(The pod stays Pending: the scheduler and the node daemons join in the local-cluster issue.)"
echo
echo "The API server logged to $state/logs/apiserver.log; it stops now."
