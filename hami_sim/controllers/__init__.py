"""Stand-ins for kube-controller-manager's controllers that the local cluster needs."""

WORKERS = 50
"""The ResourceClaim controller's concurrent syncs: kube-controller-manager's default (`ConcurrentSyncs`,
pkg/controller/resourceclaim/config/v1alpha1/defaults.go: "50 workers were needed to pass the 1000
simulated node DRA test", kubernetes#133113). With 4, a few slow API answers held every worker and a
chaos run's claims were created minutes after their pods (issue 31)."""
