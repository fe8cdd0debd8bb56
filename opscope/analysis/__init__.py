"""Analysis: events -> per-op costs and roofline -> findings. Torch-free."""
