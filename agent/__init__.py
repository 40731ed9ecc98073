"""gpufleet agent: reads GPU and MIG-slice utilization through NVML and posts it to the server."""

__version__ = "0.1.0"
