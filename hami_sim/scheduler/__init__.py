"""kube-scheduler stand-in: reads a `KubeSchedulerConfiguration`, schedules the pods of one profile with
kube-scheduler's queue, own filters and scoring, and calls the configured HTTP extender (filter,
prioritize, bind) as kube-scheduler does. Pods with ResourceClaims go through kube's DynamicResources
plugin (`dra/`: the structured allocator with CEL selectors and consumable capacity).

`SchedulerStandIn` runs on the caller's loop; `SchedulerRunner` runs one on its own thread;
`hami-sim scheduler` (`cli`) runs one as a process. See docs/scheduler-standin.md.
"""

from hami_sim.scheduler.config import (
    ConfigError,
    ExtenderConfig,
    KubeSchedulerConfiguration,
    SchedulerConfig,
    load_configuration,
    load_scheduler_config,
    parse_configuration,
    parse_configuration_text,
    scheduler_config,
)
from hami_sim.scheduler.runner import SchedulerRunner
from hami_sim.scheduler.standin import Decision, SchedulerCounters, SchedulerStandIn, SchedulerStartError

__all__ = [
    "ConfigError",
    "Decision",
    "ExtenderConfig",
    "KubeSchedulerConfiguration",
    "SchedulerConfig",
    "SchedulerCounters",
    "SchedulerRunner",
    "SchedulerStandIn",
    "SchedulerStartError",
    "load_configuration",
    "load_scheduler_config",
    "parse_configuration",
    "parse_configuration_text",
    "scheduler_config",
]
