"""hami-node: the per-GPU-node daemon (kubelet device plugin, GPU health, node inventory)."""
