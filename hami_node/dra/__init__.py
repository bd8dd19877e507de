"""Dynamic Resource Allocation (DRA) support of the node daemon: the kubelet plugin protocols it serves."""
