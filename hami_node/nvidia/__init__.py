"""NVIDIA's own sharing modes, as NVIDIA's k8s-device-plugin implements them: its config file v1
(`config`), the resources -> devices map of the MIG strategies none/single/mixed with time-slicing
replicas (`device_map`), replica IDs, request validation, the Allocate response and the preferred
allocation of shared devices (`replicas`), and the labels GPU feature discovery sets for them (`labels`).

Pure: functions over data. The only I/O is `config.load_config_file`, which reads the file and hands its
text to the parser. The node daemon adapts its backend's GPUs and MIG devices into
`device_map.NvidiaDevice` and serves the map (the wiring is not in this package).

Pinned upstream: NVIDIA/k8s-device-plugin v0.20.0 (`1b826acc`); HAMi v2.10 vendors v0.19.3, and where the
two differ the docstrings say so.
"""
