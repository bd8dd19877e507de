"""hami-control: the mutating admission webhook and the kube-scheduler extender."""
