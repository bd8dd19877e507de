"""Stand-ins for kube-controller-manager's controllers that the local cluster needs."""
