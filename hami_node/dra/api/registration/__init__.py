"""Kubelet plugin registration API v1 (``pluginregistration.Registration``): generated stubs ``api_pb2``
and ``api_pb2_grpc`` from ``proto/pluginregistration/v1/api.proto``."""
