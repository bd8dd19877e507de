"""Kubelet DRA plugin API v1 (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``): generated stubs
``api_pb2`` and ``api_pb2_grpc`` from ``proto/dra/v1/api.proto``."""
