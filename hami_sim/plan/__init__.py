"""`hami-sim plan`: capacity planning with hami-control's fit and score code (docs/planning.md).

Kept free of heavy imports: `hami-sim` builds every sub-command's parser at start-up."""

POLICY_NAMES = ("binpack", "spread", "topology", "hami", "fragmentation")
"""The planner's policies (`engine.POLICIES`), in report order."""
DEFAULT_SPLIT = 10
"""Tasks that may share one GPU (HAMi's deviceSplitCount default)."""
