"""hami-py's one way to talk to Kubernetes: configuration and credentials (config.py, without the
official `kubernetes` package), one asyncio HTTP client of plain JSON dicts, one error type, one backoff
policy and one list+watch reflector. Imported by hami_control and hami_sim (hami_node and the kubelet
stand-in move onto it next, issue 14); never by hami_api, which stays pure."""
