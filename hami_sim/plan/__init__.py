"""`hami-sim plan`: capacity planning with hami-control's fit and score code (docs/planning.md).

Kept free of heavy imports: `hami-sim` builds every sub-command's parser at start-up."""

POLICY_NAMES = ("binpack", "spread", "topology", "hami", "fragmentation", "fragmentation-extender")
"""The planner's policies run by default (`engine.POLICIES`), in report order."""
EXTRA_POLICY_NAMES = ("fragmentation-best", "fragmentation-install")
"""Policies run only when `--policies` names them: `fragmentation-best`, the extender's fragmentation
policy with /filter narrowed to the least fragmenting nodes, CPU in the measure (docs/planning.md, "A
decisive extender"); `fragmentation-install`, what an install with daemonset/components/fragmentation
does (docs/planning.md, "The install")."""
INSTALL_EXTENDER_WEIGHT = 11
INSTALL_PERCENTAGE_OF_NODES_TO_SCORE = 100
"""The first extender entry's `weight` and the `percentageOfNodesToScore` of
daemonset/components/fragmentation/kube-scheduler-config.yaml, which `fragmentation-install` models
whatever `--extender-weight` and `--percentage-of-nodes-to-score` say (a test keeps them equal)."""
DEFAULT_EXTENDER_WEIGHT = 1
"""The extender's `weight` in daemonset/scheduler/kube-scheduler-config.yaml (a test keeps them equal):
kube-scheduler adds `score x weight x 10` of hami-control's /prioritize to its own scores."""
DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE: int | None = None
"""`percentageOfNodesToScore` of that configuration: not set, so kube's adaptive share (every node below
100 nodes; 50% - nodes/125, at least 5%, at least 100 nodes above). A test keeps them equal."""
DEFAULT_SPLIT = 10
"""Tasks that may share one GPU (HAMi's deviceSplitCount default)."""
