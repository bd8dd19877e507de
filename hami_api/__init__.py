"""The wire contract shared by the node daemon and the control plane: resource names, typed values and
annotation codecs, exactly as HAMi v2.10 writes them. Pure: no I/O, no clock, no environment."""
