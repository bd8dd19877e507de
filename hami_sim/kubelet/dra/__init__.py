"""Kubelet's DRA side, as a stand-in: the plugin watcher on `plugins_registry` (`watcher`), the
registration of DRA plugins and the choice of their gRPC service (`registration`), the connections to
them and the wiping of ResourceSlices (`plugins`), the claim cache with its checkpoint
(`checkpoint`, `manager`), kubelet's claim rules (`claims`) and the container runtime's CDI resolution
(`cdi`). See docs/kubelet-standin.md, "DRA".

Import the modules themselves (`from hami_sim.kubelet.dra.manager import DraManager`): this package
imports nothing, so that `hami_sim.kubelet.config` can import the checkpoint's file name.
"""
