"""Prometheus metrics and operator logs."""
