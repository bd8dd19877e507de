"""Kubelet PodResources API v1 (`v1.PodResourcesLister`): the stand-in's server, and the generated gRPC
stubs it serves (generated into `hami_node.plugin.podresources`, whose node daemon reads the API too;
re-exported here): ``from hami_sim.kubelet.podresources import api_pb2, api_pb2_grpc``.
"""

from hami_node.plugin.podresources import api_pb2, api_pb2_grpc

__all__ = ["api_pb2", "api_pb2_grpc"]
