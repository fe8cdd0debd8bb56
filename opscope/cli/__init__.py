"""The `opscope` command line: a thin layer that parses, calls the library, and prints."""

from opscope.cli.app import app, main

__all__ = ["app", "main"]
