"""Environments and the vectorization that actors use to step them as a batch."""
