"""Prometheus exposition at GET /metrics: the server's own health and the fleet's figures now (docs/metrics.md)."""
