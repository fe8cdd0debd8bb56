"""The rules about compiled models (graph-break, recompile, compile-fallback, compile-copy, cudagraph-skipped)
on real TORCH_TRACE logs of torch 2.13 on CPU (tests/fixtures/compile/record_logs.py records them from
compiled_model.py) and the H200 log; and the rules that would suggest torch.compile, on compiled runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import line_of, share_gates_off
from opscope import units
from opscope.analysis.trace_file import analyze_trace_file
from opscope.findings import RULES, Context, run_rules
from opscope.findings.fusion import PATTERNS, pattern_for
from opscope.machine.peaks import Peaks
from opscope.trace.torch_trace import TorchTraceLog, read_torch_trace

FIXTURES = Path(__file__).parents[1] / "fixtures"
COMPILE = FIXTURES / "compile"
MODEL = COMPILE / "compiled_model.py"
H200_LOG = FIXTURES / "h200" / "h200_torch-compile_block_bf16.torch_trace.log.gz"
COMPILE_RULES = ("graph-break", "recompile", "compile-fallback", "compile-copy", "cudagraph-skipped")
NO_OPS = {"op": [], "time_us_total": [], "calls": [], "compiled_graph": [], "source_location": []}


def log_of(case: str) -> TorchTraceLog:
    return read_torch_trace(COMPILE / f"{case}.torch_trace.log.gz")


def context(log: TorchTraceLog | None, ops: dict | None = None, events: dict | None = None, steps: int = 1) -> Context:
    return Context(ops=ops if ops is not None else NO_OPS, events=events or {}, peaks=Peaks(None), gpu=False,
                   source="trace", steps=steps, step_time_us=1.0, compile_log=log)


def found(ctx: Context, rule: str) -> list[dict]:
    return [f.to_json() for f in RULES[rule](ctx)]


def at(needle: str) -> str:
    """The location of the fixture model's line holding `needle`, as the logs name the file."""
    return f"compiled_model.py:{line_of(MODEL, needle)}"


def test_no_log_no_compile_findings():
    for rule in COMPILE_RULES:
        assert found(context(None), rule) == []


def test_a_clean_compile_has_no_compile_findings():
    # the H200 block: one graph, no break or recompilation; its cuDNN attention is an ATen call inductor
    # always makes (not a fallback to report), and every generated kernel computes something
    log = read_torch_trace(H200_LOG)
    assert any(k.kind == "fallback" and "attention" in k.name for _, k in log.kernels())
    for rule in COMPILE_RULES:
        assert found(context(log), rule) == [], rule


def test_graph_break_at_the_item_line():
    (f,) = found(context(log_of("graph_break")), "graph-break")
    assert f["source_location"] == at("if y.sum().item() > 0:")
    assert f["op"] == "forward" and f["severity"] == "medium" and f["est_savings_us"] is None
    assert "(1 of the run's 1 graph break)" in f["message"]
    assert "Unsupported Tensor.item() call with capture_scalar_outputs=False" in f["message"]
    assert "Explanation" not in f["message"]  # the reason's first line only
    assert "capture_scalar_outputs = True" in f["suggestion"]  # torch's own hint
    assert "torch.cond" in f["suggestion"] and "fullgraph=True" in f["suggestion"]


def test_graph_break_line_without_dynamos_break_record():
    log = log_of("graph_break")
    # without the graph-break record, the line in the resume function's name (torch_dynamo_resume_in_forward_at_30)
    (f,) = found(context(dataclasses.replace(log, graph_breaks=[])), "graph-break")
    assert f["source_location"] == at("if y.sum().item() > 0:")
    # without the resume function either, where the broken function starts
    alone = dataclasses.replace(log, graph_breaks=[], metrics=log.metrics[:1])
    (f,) = found(context(alone), "graph-break")
    assert f["source_location"] == at("def forward(self, x):")


def test_graph_break_reason_is_one_bounded_printable_line():
    log = log_of("graph_break")
    hostile = "\x1b[31mUnsupported\x1b]0;title\x07 call " + "x" * 100_000 + "\nHint: \x1b[2J" + "y" * 10_000
    m = dataclasses.replace(log.metrics[0], restart_reasons=(hostile,))
    (f,) = found(context(dataclasses.replace(log, metrics=[m, *log.metrics[1:]])), "graph-break")
    for text in (f["message"], f["suggestion"]):
        assert "\x1b" not in text and "\x07" not in text and "\n" not in text
        assert len(text) < 2_000


def test_recompilations_name_the_failed_guards_and_the_limit():
    log = log_of("recompile")
    scaled, counter = found(context(log), "recompile")
    assert scaled["source_location"] == at("return torch.relu(self.l(x)) * n + 1")
    assert "compiled forward 3 times (2 recompilations)" in scaled["message"]
    assert "`n == 1`" in scaled["message"] and "`tensor 'x' size mismatch at index 0. expected 8, actual 12`" in \
        scaled["message"]
    seconds = sum(m.entire_frame_compile_time_s for m in log.metrics if m.compile_id in ("0/1", "0/2"))
    assert f"took {units.duration(seconds * 1e6)} of compile time (not step time)" in scaled["message"]
    assert scaled["est_savings_us"] is None  # compile time is not step time
    assert "torch._dynamo.config.recompile_limit (8)" in scaled["message"]
    assert "pass a changing number as a tensor" in scaled["suggestion"]  # n, a Python int
    assert "mark_dynamic" in scaled["suggestion"] and "dynamic=True" in scaled["suggestion"]  # the batch size
    assert scaled["severity"] == "medium"
    # a module's int attribute changes every call: recompiled until the limit, then eager
    assert counter["source_location"] == at("self.calls += 1")
    assert "`self.calls == 0`; `self.calls == 1`" in counter["message"]
    assert "hit torch._dynamo.config.recompile_limit (2 here; default 8)" in counter["message"]
    assert "run eager (uncompiled)" in counter["message"] and counter["severity"] == "high"
    assert "allow_unspec_int_on_nn_module" in counter["suggestion"]


def test_ops_inductor_left_to_aten_but_not_attention():
    hits = {f["op"]: f for f in found(context(log_of("fallback")), "compile-fallback")}
    assert sorted(hits) == ["aten::nonzero", "opscope_fixture::triple"]  # not SDPA's flash attention for CPU
    nonzero, custom = hits["aten::nonzero"], hits["opscope_fixture::triple"]
    assert nonzero["source_location"] == at("idx = torch.nonzero(x > 0)")
    assert "output size depends on the data" in nonzero["message"] and "nonzero_static" in nonzero["suggestion"]
    assert custom["source_location"] == at("return triple(x.sin()) + 1")
    assert "custom op" in custom["message"] and "torch.library.triton_op" in custom["suggestion"]
    assert all(f["est_savings_us"] is None and f["severity"] == "low" for f in hits.values())


def test_a_copy_kernel_with_its_time_from_the_run(tmp_path):
    log = log_of("copy")
    run = analyze_trace_file(COMPILE / "copy.json.gz", out=tmp_path / "run")
    ctx = context(log, ops=run.ops, events=run.events, steps=run.summary["steps"])
    (f,) = found(ctx, "compile-copy")  # not cpp_fused_relu_1, which computes
    assert f["op"] == "graph_0_cpp_fused__to_copy_clone_transpose_0"
    assert f["source_location"] == at("t = x.transpose(0, 1).contiguous()")
    assert at("h = x.to(torch.float16)") in f["message"]  # the conversion it fused, from its own line
    assert "(clone, permute, convert_element_type)" in f["message"]
    row = run.ops["op"].index("graph_0_cpp_fused__to_copy_clone_transpose_0")
    assert f["est_savings_us"] == pytest.approx(run.ops["time_us_total"][row])
    assert "memory layout" in f["suggestion"] and "one dtype" in f["suggestion"]
    # without a row for the kernel its time is unknown
    (f,) = found(context(log), "compile-copy")
    assert f["est_savings_us"] is None and "no row of its own" in f["message"]


def test_cudagraph_skip_reason_from_the_compile_metrics():
    (f,) = found(context(log_of("cudagraph_skip")), "cudagraph-skipped")
    assert "skipping cudagraphs due to cpp-wrapper does not support graph partition yet" in f["message"]
    assert f["source_location"] == at("def forward(self, x, n):")  # the reason has no stack: the function
    assert "cpp_wrapper" in f["suggestion"] and f["severity"] == "medium"
    assert found(context(log_of("recompile")), "cudagraph-skipped") == []


def test_what_the_log_says_carries_no_noise_note_and_a_copys_time_does():
    noisy = {"verdict": "noisy", "reason": "other processes used 0.93 of 2 cores"}
    for case, rule in (("graph_break", "graph-break"), ("recompile", "recompile"), ("fallback", "compile-fallback"),
                       ("cudagraph_skip", "cudagraph-skipped"), ("copy", "compile-copy")):
        ctx = dataclasses.replace(context(log_of(case)), noise=noisy)
        findings = run_rules(ctx, [rule])
        assert findings, rule
        # a time from a noisy run may read high: the copy kernel's saving says so; the log's facts do not
        assert all(("Measured on a noisy run" in f["message"]) is (rule == "compile-copy") for f in findings), rule


# --- no torch.compile suggestion for code that already runs compiled -------------------------------------


def test_launch_bound_on_a_compiled_model_does_not_suggest_compiling_it(tmp_path):
    run = analyze_trace_file(FIXTURES / "h200" / "h200_torch-compile_block_bf16.json.gz", out=tmp_path / "run")
    (f,) = [f for f in run.findings if f["rule"] == "launch-bound"]
    assert "torch.compile" not in f["suggestion"]
    assert "mode='reduce-overhead'" in f["suggestion"] and "graph-break" in f["suggestion"]


def test_fusion_outside_the_compiled_graphs_says_so(tmp_path):
    # the gradient accumulation after the compiled backward (add_ x2): eager ops in a compiled run
    with share_gates_off():
        run = analyze_trace_file(COMPILE / "cpu_compiled_train_kernel_events.json.gz", out=tmp_path / "run",
                                 peak_bw=20.0, peak_flops=["100"])
    fusion = [f for f in run.findings if f["rule"] == "fusion"]
    assert fusion
    for f in fusion:
        assert "torch.compile" not in f["suggestion"]
        assert "outside its compiled graphs" in f["suggestion"]


def test_fused_op_suggestions_for_compiled_code_do_not_name_torch_compile():
    for label, need, _, _ in PATTERNS:
        assert "torch.compile" not in pattern_for(set(need), compiled=True)[1], label
    assert any("torch.compile" in pattern_for(set(need))[1] for _, need, _, _ in PATTERNS)
    assert pattern_for({"add", "mul"}, compiled=True) == ("", "")


@pytest.mark.parametrize("trace", [COMPILE / "cpu_compiled_inference.json.gz",
                                   FIXTURES / "traces" / "mi300x_torch-compile_triton.json.gz"])
def test_overhead_on_a_compiled_model_does_not_suggest_compiling_it(trace, tmp_path, monkeypatch):
    import opscope.findings.overhead as overhead

    monkeypatch.setattr(overhead, "MIN_SHARE", 0.0)  # these small traces' overhead-bound ops are under the gates
    monkeypatch.setattr(overhead, "MIN_US_PER_STEP", 0.0)
    run = analyze_trace_file(trace, out=tmp_path / "run")
    (f,) = [f for f in run.findings if f["rule"] == "overhead"]
    assert "torch.compile" not in f["suggestion"] and "already runs compiled" in f["suggestion"]


def test_low_bandwidth_on_a_compiled_model_does_not_suggest_compiling_it(tmp_path):
    import opscope.findings.low_bandwidth as low_bandwidth

    run = analyze_trace_file(COMPILE / "cpu_compiled_inference.json.gz", out=tmp_path / "run")
    ctx = context(None, ops=run.ops, events=run.events)
    inside = next(r for r in range(len(run.ops["op"])) if run.ops["compiled_graph"][r])
    row = {k: v[inside] for k, v in run.ops.items()}
    for cause in (None, "strided", "broadcast", "small-inner"):
        text = low_bandwidth._suggestion(ctx, cause, row)
        assert "torch.compile" not in text and text != low_bandwidth.SUGGESTIONS[cause]
    assert "inside a compiled graph" in low_bandwidth._suggestion(ctx, None, row)
    assert "outside its graphs" in low_bandwidth._suggestion(ctx, None, {**row, "compiled_graph": ""})
