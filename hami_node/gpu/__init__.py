"""GPU backends (NVML and a fake inventory) behind one small interface."""
