"""Analysis: states, idle GPUs, MIG use and cost waste, computed once for pages and the report alike."""
