"""Typed errors. Anything raised as `OpscopeError` is bad input: the CLI prints its message as one
line on stderr and exits 2 (no traceback unless --debug)."""

from __future__ import annotations


class OpscopeError(Exception):
    """Bad input from the user: a missing file, a malformed target or trace, an unusable option."""

    exit_code = 2


class TargetError(OpscopeError):
    """The model file cannot be loaded or run."""


class CompileError(TargetError):
    """torch.compile cannot compile the model: dynamo refused its code (a graph break under
    fullgraph=True, an unsupported construct) or the backend failed."""


class TraceError(OpscopeError):
    """The trace file cannot be read as a torch.profiler Chrome trace."""


class OutputError(OpscopeError):
    """The run directory cannot be written where asked."""


class NsightError(OpscopeError):
    """Nsight Systems / Nsight Compute cannot run or its output cannot be read (opscope.nsight)."""
