"""The vendor registry: every accelerator HAMi v2.10 shares, one module per vendor (`base` has the
interface, `standard` HAMi's common Fit, `config` the device config file, `registry` the table)."""
