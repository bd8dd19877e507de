"""Chaos testing of the local cluster (issue 16): a seeded workload and fault schedule run against
`hami-sim` while an independent invariant checker (`checker.InvariantChecker`) reads the API server and
the kubelet stand-ins' state files and records every violation with its evidence.

The checker trusts nothing of ours: it reads through the official `kubernetes` client and parses HAMi's
annotations, kubelet's checkpoints and the runtime's `containers.json` with its own small decoders
(`decoding`), so a bug in hami_api's codecs or in the stand-ins' writers cannot hide a violation.
"""
