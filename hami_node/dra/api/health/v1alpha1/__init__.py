"""Kubelet DRA resource health API v1alpha1 (``v1alpha1.DRAResourceHealth``): generated stubs ``api_pb2``
and ``api_pb2_grpc`` from ``proto/dra-health/v1alpha1/api.proto``."""
