"""A local cluster on one machine: an in-memory Kubernetes API server, and stand-ins for
kube-scheduler and kubelet, so the whole system runs end to end with fake GPUs."""
