"""The chaos run: a churning workload under a seeded fault schedule, watched by an invariant checker."""
