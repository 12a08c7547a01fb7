"""Benchmarks: commands that print tables (``python -m benchmarks.mechanisms``)."""
