"""Benchmarks: scripts that print measured figures. Never run as tests."""
