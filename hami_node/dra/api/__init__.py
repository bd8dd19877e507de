"""Generated gRPC stubs of the kubelet DRA plugin protocols (``python hack/gen_proto.py``).

- ``v1``, ``v1beta1``: ``k8s.io.kubelet.pkg.apis.dra.{v1,v1beta1}.DRAPlugin`` (from ``proto/dra/``);
- ``registration``: ``pluginregistration.Registration`` (from ``proto/pluginregistration/v1/``);
- ``health.v1alpha1``: ``v1alpha1.DRAResourceHealth`` (from ``proto/dra-health/v1alpha1/``).

Import the stubs explicitly, e.g. ``from hami_node.dra.api.v1 import api_pb2, api_pb2_grpc``.
"""
