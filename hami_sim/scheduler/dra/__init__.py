"""kube-scheduler's DynamicResources plugin for the scheduler stand-in: CEL device selectors (`selector`),
ResourceSlices parsed and gathered into pools (`inventory`), the structured allocator (`allocator`), the
plugin's state and cycle (`plugin`) and its API writes (`binding`). See docs/scheduler-standin.md."""
