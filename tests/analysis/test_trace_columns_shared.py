"""The event table shares the trace's own columns (opscope.analysis.events.build_events: a pointer per event
and column saved, 20 MiB on a 640k-event trace), so no analysis may change a trace column in place. Every
analysis below runs on a trace whose columns raise on any in-place change: CPU, CUDA and ROCm traces, a
compiled model with its TORCH_TRACE log, one saved by `opscope profile` (embedded lines and modules), and a
CUDA-graph replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import opscope.analysis.trace_file as trace_file
from conftest import TESTS
from opscope.analysis.pipeline import prepare_events
from opscope.analysis.trace_file import analyze_trace_file
from opscope.table import Coded, Column, nrows
from opscope.trace.reader import load_trace
from opscope.trace.torch_trace import read_torch_trace


class FrozenColumn(list[Any]):
    """A list that refuses every in-place change (reading, slicing and `+` still work)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an analysis changed a column of trace.ops in place")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = sort = reverse = clear = _refuse


TRACES = [
    (TESTS / "fixtures" / "traces" / "h100_vit-image-classifier_bf16.json.gz", None),
    (TESTS / "fixtures" / "traces" / "mi300x_torch-compile_triton.json.gz", None),
    (TESTS / "fixtures" / "traces" / "sglang_qwen3-8b_decode_cudagraph.json.gz", None),
    (TESTS / "fixtures" / "cpu_traces" / "avx2_convnet_bf16_train.json.gz", None),
    (TESTS / "fixtures" / "h200" / "h200_hf-llama-tiny_bf16.json.gz", None),
    (TESTS / "fixtures" / "h200" / "h200_torch-compile_block_bf16.json.gz",
     TESTS / "fixtures" / "h200" / "h200_torch-compile_block_bf16.torch_trace.log.gz"),
]


@pytest.mark.parametrize(("path", "log"), TRACES, ids=[p.name.split(".")[0] for p, _ in TRACES])
def test_no_analysis_changes_a_trace_column_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     path: Path, log: Path | None) -> None:
    load = trace_file.load_trace
    frozen: list[Any] = []

    def load_frozen(*args: Any, **kwargs: Any) -> Any:
        trace = load(*args, **kwargs)
        trace.ops = {c: FrozenColumn(v) for c, v in trace.ops.items()}
        frozen.append(trace)
        return trace

    monkeypatch.setattr(trace_file, "load_trace", load_frozen)
    run = analyze_trace_file(path, out=tmp_path / "run", peak_bw=100.0, peak_flops=["bf16=100"],
                             torch_trace=log)
    assert frozen and nrows(run.ops) > 0
    assert run.events is not None
    # the sharing is real, and survives the compaction (opscope.analysis.pipeline.compact_columns): the event
    # table's name column is the trace's own, coded once for both; coded columns refuse changes themselves
    assert run.events["name"] is frozen[0].ops["name"]
    assert isinstance(run.events["name"], Coded)


def test_a_frozen_column_refuses_changes() -> None:
    col = FrozenColumn([1, 2])
    for change in (lambda: col.__setitem__(0, 5), lambda: col.append(3), lambda: col.sort()):
        with pytest.raises(AssertionError):
            change()
    assert col + [3] == [1, 2, 3] and col[1:] == [2]


@pytest.mark.parametrize(("path", "log"), TRACES, ids=[p.name.split(".")[0] for p, _ in TRACES])
def test_every_trace_and_event_column_is_compact(path: Path, log: Path | None) -> None:
    """Columns are compact from the moment they exist (the reader's ColumnBuilder, build_events' compacted):
    a list per column, a pointer and often a number object per event, was most of analyze's peak memory."""
    trace = load_trace(path)
    for name in ("ops", "kernels", "launches", "python", "modules", "memory"):
        table = getattr(trace, name)
        assert not [c for c, v in table.items() if len(v) and not isinstance(v, Column)], name
    ev, _, _ = prepare_events(trace, None, None, read_torch_trace(log) if log else None, None)
    assert not [c for c, v in ev.items() if len(v) and not isinstance(v, Column)]
    assert not [c for c, v in trace.kernels.items() if len(v) and not isinstance(v, Column)]
