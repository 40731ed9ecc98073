"""`gpufleet demo`: a simulated fleet with two weeks of history, kept live by the real agent on fake NVML."""
