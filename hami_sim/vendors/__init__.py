"""Device-plugin stand-ins of the accelerators HAMi shares besides NVIDIA (issue 26), one per vendor node
of a local cluster: they write the node inventory HAMi's scheduler side reads, register their resources
with the kubelet stand-in over the real device-plugin API, and answer Allocate as each vendor's
HAMi-mode plugin does (docs/vendor-nodes.md).

- `table`: one table per vendor (resource names, annotations, env keys, the products' defaults) and the
  fake devices of a node (`DeviceSpec`), pure;
- `inventory`: the devices a node has, what goes on its Node and what ListAndWatch advertises, pure;
- `allocate`: which pod is being allocated and each vendor's Allocate answer and pod patches, pure;
- `plugin`: the stand-in itself (gRPC servers on Unix sockets, registration, the API calls);
- `cli`: `hami-sim vendor-plugin`, one stand-in as a process.
"""

READY_MARKER = "hami-sim vendor-plugin ready"
"""What a stand-in logs once its inventory is written and its resources are registered (the local
cluster waits for it)."""
