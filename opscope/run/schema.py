"""The run directory's format: its files, their columns and the fixed texts a run's rows carry."""

from __future__ import annotations

from typing import Any

UNATTRIBUTED = "(unattributed kernels)"


GRAPH_KERNEL_NOTE = ("replayed from a CUDA/HIP graph: the trace records no shapes for it (analyze with --capture "
                     "to map it to the op that launched it during capture)")


LOOSE_KERNEL_NOTE = "launched outside any op: the trace records no shapes for it"


GPU_ONLY_NOTE = "GPU-only trace: no op or shapes recorded"


def kernels_for_rows(swap_candidates: Any, rows: range) -> dict[int, list[str]]:
    """{row index: candidate kernel names} for the given rows of a run's summary `swap_candidates`."""
    out: dict[int, list[str]] = {}
    if not isinstance(swap_candidates, list):
        return out
    for c in swap_candidates:
        if not isinstance(c, dict) or not isinstance(c.get("kernel"), str) or not isinstance(c.get("rows"), list):
            continue
        for r in c["rows"]:
            if isinstance(r, int) and r in rows:
                out.setdefault(r, []).append(c["kernel"])
    return out
