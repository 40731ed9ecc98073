"""gpufleet server: ingest, store, analyse and show GPU fleet utilization."""

__version__ = "0.1.0"
