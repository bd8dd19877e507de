"""Kubelet DRA resource health APIs (``DRAResourceHealth``), one subpackage per version."""
