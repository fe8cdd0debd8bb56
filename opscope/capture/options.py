"""What every capture shares besides its options (opscope.target.specs.ProfileOptions), torch-free: the
progress hook, and the names of the NVTX ranges that the Nsight passes select by."""

from __future__ import annotations


class Progress:
    """Phase reporting hook: silent here; the supervised child reports on its control pipe (the CLI
    shows a progress bar), a rank of a multi-process job writes its warnings to stderr."""

    def phase(self, name: str, total: int | None = None) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def warn(self, message: str) -> None: ...


# NVTX ranges of the measured passes (and of `opscope profile --nvtx`): one push/pop range per step, with
# the same name every step so that one ncu filter selects them all; one per forward of each top-level
# module (the model's direct children), named after it.
STEP_RANGE = "opscope_step"


MODULE_RANGE_PREFIX = "opscope_module:"
