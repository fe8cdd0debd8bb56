"""A run that does not keep its tables (analyze(keep_tables=False), what `opscope analyze` does): the same
run directory, with the event table and the trace's tables freed once nothing later reads them."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from conftest import TRACES
from opscope.analysis import pipeline
from opscope.analysis.events import build_events
from opscope.analysis.replay import replay
from opscope.analysis.replay_graph import READS, build_graph
from opscope.analysis.trace_file import analyze_trace_file
from opscope.api import analyze
from opscope.trace.reader import TraceData, load_trace

NAMES = ["h100_bert-small_bf16", "sglang_qwen3-8b_decode_cudagraph", "mi300x_torch-compile_triton"]


@pytest.mark.parametrize("name", NAMES)
def test_the_graph_is_built_from_the_columns_it_says_it_reads(name: str):
    """replay_graph.READS names every column build_graph reads: the tables freed but those give the same
    graph (a new column read and not named fails here, as release_tables would make it fail)."""
    trace = load_trace(TRACES / f"{name}.json.gz")
    ev = build_events(trace)
    full = build_graph(trace, ev)
    pipeline.release_tables(trace, ev, READS)
    assert set(ev) <= set(READS["events"]) and not trace.ops and not trace.memory and trace.steps is not None
    alone = build_graph(trace, ev)
    for field in ("kind", "start", "dur", "ptr", "pred", "lag", "chained", "heads", "ends", "by_owner", "names"):
        assert getattr(alone, field) == getattr(full, field), field
    assert replay(alone).step_us == replay(full).step_us


@pytest.mark.parametrize("name", NAMES)
def test_a_run_that_does_not_keep_its_tables_writes_the_same_files(name: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    seen: list[TraceData] = []
    original = pipeline.analyze

    def analyze_keeping_the_trace(trace: TraceData, **kwargs: object) -> object:
        seen.append(trace)
        return original(trace, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("opscope.analysis.trace_file.analyze", analyze_keeping_the_trace)
    kept = analyze_trace_file(TRACES / f"{name}.json.gz", out=tmp_path / "kept")
    freed = analyze_trace_file(TRACES / f"{name}.json.gz", out=tmp_path / "freed", keep_tables=False)
    assert kept.events is not None and kept.kernels is not None
    assert freed.events is None and freed.kernels is None
    trace = seen[-1]  # freed: only its steps are left
    assert not trace.ops and not trace.launches and not trace.kernels and not trace.memory and not trace.python
    files = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "freed").iterdir())
    for f in files:
        if f == "meta.json":
            a, b = (json.loads((tmp_path / d / f).read_text()) for d in ("kept", "freed"))
            a.pop("created"), b.pop("created")
            assert a == b
        else:
            assert filecmp.cmp(tmp_path / "kept" / f, tmp_path / "freed" / f, shallow=False), f


def test_the_api_keeps_the_tables_unless_asked_not_to(tmp_path: Path):
    trace = TRACES / "h100_bert-small_bf16.json.gz"
    assert len(analyze(trace, out=tmp_path / "a").to_pandas("events")) > 0
    run = analyze(trace, out=tmp_path / "b", tables=False)
    assert len(run.to_pandas("ops")) > 0
    with pytest.raises(KeyError, match="no events table"):
        run.to_pandas("events")
