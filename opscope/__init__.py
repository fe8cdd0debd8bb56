"""opscope: per-operator roofline profiling for PyTorch models."""

__version__ = "0.1.0"
