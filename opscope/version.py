"""opscope's version (its own module, so that reading it imports nothing else of opscope)."""

__version__ = "0.1.0"
