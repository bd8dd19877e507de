"""hami-py's one way to talk to Kubernetes: configuration and credentials (config.py, without the
official `kubernetes` package), one asyncio HTTP client of plain JSON dicts, one error type, one backoff
policy, one list+watch reflector, and a blocking bridge to them for thread-based programs (blocking.py).
Lease-based leader election (election.py). Imported by hami_control, hami_sim and hami_node (through the
bridge); never by hami_api, which stays pure."""
