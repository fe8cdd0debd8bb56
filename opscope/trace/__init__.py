"""Trace reading: torch.profiler Chrome traces into column tables, and the kernel-name vocabulary."""
