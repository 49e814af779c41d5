"""What a trainer reports besides its logs: its Prometheus metrics and its training curves."""
