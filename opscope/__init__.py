"""opscope: which PyTorch operators make your model slow, why, and what to do about it.

    import opscope
    run = opscope.profile(model, [x])          # or opscope.profile("model.py")
    run.print(); run.findings; run.ops.to_pandas()

    with opscope.profiling() as session:       # a region of your own loop
        for batch in data:
            train_step(batch)
            session.step()
    session.run

    opscope.analyze("trace.json.gz"), opscope.load("reports/x-..."), opscope.compare(a, b),
    opscope.swap("model.py", kernels=["rms_norm"])
    opscope.profile_repeated("model.py", 5, out="runs")         # samples for the CI gate
    opscope.baseline_save(["runs/run-1", "runs/run-2"], "main"), opscope.gate(["pr/run-1"], "main")

`import opscope` is cheap: the names below are imported on first use (torch only by the functions that
run a model). See docs/guide/python-api.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opscope.errors import OpscopeError
from opscope.version import __version__

if TYPE_CHECKING:
    from opscope.api import (
        Comparison,
        Finding,
        Progress,
        Rows,
        Run,
        Session,
        analyze,
        baseline_save,
        compare,
        explain_op,
        gate,
        load,
        profile,
        profile_file,
        profile_repeated,
        profiling,
        swap,
    )
    from opscope.api.whatif import whatif  # the function (opscope.api.whatif is also its module's name)

__all__ = [
    "Comparison",
    "Finding",
    "OpscopeError",
    "Progress",
    "Rows",
    "Run",
    "Session",
    "__version__",
    "analyze",
    "baseline_save",
    "compare",
    "explain_op",
    "gate",
    "load",
    "profile",
    "profile_file",
    "profile_repeated",
    "profiling",
    "swap",
    "whatif",
]


# opscope.api's names, imported on first use
_LAZY = frozenset(__all__) - {"OpscopeError", "__version__"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import opscope.api

        value = getattr(opscope.api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'opscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
