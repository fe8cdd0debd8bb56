"""summary.json "compile": a compiled model's compile times per frame compilation, from its TORCH_TRACE
log (real logs of torch 2.13: tests/fixtures/compile/record_logs.py), apart from step time."""

from __future__ import annotations

from pathlib import Path

import pytest

from opscope.analysis.pipeline import compile_summary, summarize
from opscope.run.schema import FormatError, check
from opscope.trace.torch_trace import read_torch_trace

COMPILE = Path(__file__).parents[1] / "fixtures" / "compile"


def test_frames_with_their_backward_graphs_and_graph_breaks():
    log = read_torch_trace(COMPILE / "graph_break.torch_trace.log.gz")
    first, resume = compile_summary(log)
    fwd = {m.compile_id: m for m in log.metrics}
    bwd = {m.compile_id: m for m in log.backward_metrics}
    assert (first["compile_id"], first["co_name"], first["co_filename"], first["line"]) == \
        ("0/0", "forward", "compiled_model.py", 28)
    assert resume["co_name"] == "torch_dynamo_resume_in_forward_at_30" and resume["line"] == 30
    for entry in (first, resume):
        cid = entry["compile_id"]
        # the frame's compile time and its backward graph's, compiled at the first backward()
        assert entry["compile_time_s"] == pytest.approx(fwd[cid].entire_frame_compile_time_s + bwd[cid].duration_s)
        assert entry["inductor_time_s"] == pytest.approx(fwd[cid].inductor_compile_time_s
                                                         + bwd[cid].inductor_compile_time_s)
        assert entry["recompile"] is None and entry["failed"] is None
    assert (first["graph_breaks"], resume["graph_breaks"]) == (1, 0)


def test_recompilations_and_the_failed_attempt():
    entries = compile_summary(read_torch_trace(COMPILE / "recompile.torch_trace.log.gz"))
    assert [e["compile_id"] for e in entries] == ["0/0", "0/1", "0/2", "1/0", "1/1", "1/2"]
    assert [e["recompile"] for e in entries] == [
        None, "n == 1", "tensor 'x' size mismatch at index 0. expected 8, actual 12", None, "self.calls == 0",
        "self.calls == 1"]
    limit = entries[-1]
    assert limit["failed"] == "Unsupported: Dynamo recompile limit exceeded"
    assert limit["co_name"] is None and limit["line"] is None  # a failed attempt's record names no code
    assert all(e["failed"] is None for e in entries[:-1])


def test_the_summary_carries_it_and_follows_the_run_format():
    log = read_torch_trace(COMPILE / "recompile.torch_trace.log.gz")
    ops = {"op": ["aten::mm"], "time_us_total": [10.0], "flops_per_call": [1.0], "bytes_per_call": [1.0],
           "bound": ["memory"]}
    summary = summarize(ops, steps=1, step_time_us=10.0, n_findings=0, busy=None, compile_log=log)
    assert summary["compile"] == compile_summary(log)
    assert "compile" not in summarize(ops, steps=1, step_time_us=10.0, n_findings=0, busy=None)
    check("summary.json", {k: v for k, v in summary.items() if k not in ("top_ops", "swap_candidates")})
    summary["compile"][0]["compile_time_s"] = -1.0
    with pytest.raises(FormatError):
        check("summary.json", {"compile": summary["compile"]})
