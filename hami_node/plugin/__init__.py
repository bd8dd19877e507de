"""The kubelet Device Plugin API v1beta1 server and its registration with kubelet."""
