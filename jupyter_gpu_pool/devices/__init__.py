"""The hardware edge: NVML inventory and telemetry, the local MPS daemon."""
