"""hami-py's one way to talk to Kubernetes: configuration and credentials (config.py, without the
official `kubernetes` package), one asyncio HTTP client of plain JSON dicts with client-go's client-side
rate limit and retries (client.py, flowcontrol.py), one error type, one backoff policy, one list+watch
reflector, the one event recorder (events.py, client-go's tools/record), and a blocking bridge to them
for thread-based programs (blocking.py). Lease-based leader election (election.py). Imported by
hami_control, hami_sim and hami_node (through the bridge); never by hami_api, which stays pure."""
