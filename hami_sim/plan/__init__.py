"""`hami-sim plan`: capacity planning with hami-control's fit and score code (docs/planning.md).

Kept free of heavy imports: `hami-sim` builds every sub-command's parser at start-up."""

POLICY_NAMES = ("binpack", "spread", "topology", "hami", "fragmentation", "fragmentation-extender")
"""The planner's policies (`engine.POLICIES`), in report order."""
DEFAULT_EXTENDER_WEIGHT = 1
"""The extender's `weight` in daemonset/scheduler/kube-scheduler-config.yaml (a test keeps them equal):
kube-scheduler adds `score x weight x 10` of hami-control's /prioritize to its own scores."""
DEFAULT_SPLIT = 10
"""Tasks that may share one GPU (HAMi's deviceSplitCount default)."""
