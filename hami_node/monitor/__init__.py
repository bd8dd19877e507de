"""hami-node's monitoring: HAMi-core's shared region files (`region`: the pure decoder and encoder;
`regions`: finding, reading and writing them), HAMi's priority feedback (`feedback`, pure; run by
`loop.ContainerMonitor`), the fake backend's simulated containers (`simulate`) and the Prometheus
metrics (`exporter`), served at /metrics on the health endpoint."""
