"""The TORCH_TRACE log reader, on the real H200 log and on small hand-written logs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from opscope.errors import TraceError
from opscope.trace.torch_trace import read_torch_trace, split_args

H200_LOG = Path(__file__).parents[1] / "fixtures" / "h200" / "h200_torch-compile_block_bf16.torch_trace.log.gz"


def test_the_h200_log_gives_the_graph_its_kernels_and_their_provenance() -> None:
    log = read_torch_trace(H200_LOG)
    assert len(log.graphs) == 1
    g = log.graphs[0]
    assert g.compile_id == "0/0"
    # the FX graph cache key is what the trace's `## Call CompiledFxGraph <key> ##` names
    assert g.cache_key.startswith("fq2yrsh3e3w44yli2zh3kqcfpqhyunwwaicje7pojrgfdphi3ruw")
    kernels = list(g.kernels.values())
    assert [k.handle.rsplit(":", 1)[1] for k in kernels] == [str(i) for i in range(1, 11)]  # call order
    assert [k.kind for k in kernels].count("triton") == 4
    assert [k.kind for k in kernels].count("extern") == 5
    assert kernels[2].kind == "fallback"  # cuDNN attention: an ATen op inductor calls as it is
    rms0 = g.kernels["triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0:1"]
    assert set(rms0.nodes) == {"mean", "pow_1", "convert_element_type", "convert_element_type_1", "rsqrt", "add",
                               "mul_1", "mul"}
    assert {(f.path, f.line) for s in rms0.stacks for f in s} == {("h200_compiled_block.py", 49),
                                                                  ("h200_compiled_block.py", 35),
                                                                  ("h200_compiled_block.py", 36)}
    # the generated code's signatures: `def triton_poi_fused__unsafe_view_add_3(in_out_ptr0, in_ptr0, in_ptr1, ...)`
    add3 = g.kernels["triton_poi_fused__unsafe_view_add_3:10"]
    assert (add3.pointer_args, add3.in_out_args) == (3, 1)
    assert (rms0.pointer_args, rms0.in_out_args) == (4, 0)
    # nodes with the dtype and shape the graph printer gave them, as the profiler names them
    mm = g.nodes["mm"]
    assert (mm.op, mm.args, mm.dtype, mm.shape) == ("aten::mm", ("view", "permute"), "c10::BFloat16", (4096, 6144))
    assert g.nodes["mean"].args == ("pow_1", "[-1]", "True")
    assert g.nodes["mean"].frame is not None and g.nodes["mean"].frame.line == 35
    assert g.nodes["getitem_1"].op == "getitem" and g.nodes["getitem_1"].dtype == "float"
    assert g.outputs[0] == "add_5"
    # graph inputs that are module attributes, from dynamo's graph (`L_self_modules_n1_parameters_w_`)
    assert g.params["primals_2"] == ("n1", "w")
    assert g.params["primals_8"] == ("down", "weight")
    assert "primals_1" not in g.params  # the input x
    (m,) = log.metrics
    assert (m.compile_id, m.co_name, m.co_filename, m.co_firstlineno) == ("0/0", "forward", "h200_compiled_block.py", 47)
    assert m.entire_frame_compile_time_s is not None and 4.0 < m.entire_frame_compile_time_s < 5.0
    assert m.restart_reasons == () and m.recompile_reason == ""


def _record(kind: dict[str, object], payload: str = "", frame: int = 0, attempt: int = 0) -> str:
    header = {**kind, "frame_id": frame, "frame_compile_id": attempt, "attempt": 0}
    if payload:
        header["has_payload"] = "0" * 32
    text = f"V1205 12:00:00.000000 1 torch/x.py:1] {json.dumps(header)}\n"
    return text + "".join(f"\t{line}\n" for line in payload.splitlines())


def _write(path: Path, records: list[str], gz: bool = False) -> Path:
    text = "".join(records)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_graph_breaks_and_recompilations_come_from_dynamos_metrics(tmp_path: Path) -> None:
    metrics = [
        {"compile_id": "0/0", "co_name": "forward", "co_filename": "/m.py", "co_firstlineno": 5,
         "entire_frame_compile_time_s": 1.5, "restart_reasons": ["Unsupported Tensor.item() call"]},
        {"compile_id": "1/1", "co_name": "torch_dynamo_resume_in_forward_at_9", "co_filename": "/m.py",
         "co_firstlineno": 9, "recompile_reason": "1/0: n == 0  # return y + n  # m.py:10 in forward"},
        {"compile_id": "2/0", "fail_type": "Unsupported", "fail_reason": "data-dependent branch",
         "fail_user_frame_filename": "/m.py", "fail_user_frame_lineno": 12},
    ]
    log = read_torch_trace(_write(tmp_path / "t.log.gz", [_record({"compilation_metrics": m}) for m in metrics],
                                  gz=True))
    a, b, c = log.metrics
    assert a.restart_reasons == ("Unsupported Tensor.item() call",) and a.entire_frame_compile_time_s == 1.5
    assert b.attempt == 1 and b.recompile_reason.startswith("1/0: n == 0")
    assert (c.fail_type, c.fail_user_frame and c.fail_user_frame.line) == ("Unsupported", 12)
    assert log.graphs == [] and not log.has_provenance


def test_a_directory_with_one_log_is_read_and_other_input_is_one_line(tmp_path: Path) -> None:
    d = tmp_path / "tt"
    d.mkdir()
    _write(d / "dedicated_log_torch_trace_x.log", [_record({"compilation_metrics": {"compile_id": "0/0"}})])
    assert read_torch_trace(d).metrics[0].compile_id == "0/0"
    _write(d / "dedicated_log_torch_trace_y.log", [])
    with pytest.raises(TraceError, match="2 TORCH_TRACE logs"):
        read_torch_trace(d)
    (tmp_path / "x.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceError, match="not a TORCH_TRACE log"):
        read_torch_trace(tmp_path / "x.json")
    with pytest.raises(TraceError, match="cannot read"):
        read_torch_trace(tmp_path / "missing.log")


def test_damaged_records_are_skipped_not_fatal(tmp_path: Path) -> None:
    graph = ('def forward(self, arg0_1: "f32[4, 8][8, 1]cpu"):\n'
             '    relu: "f32[4, 8][8, 1]cpu" = torch.ops.aten.relu.default(arg0_1);  arg0_1 = None\n'
             '    weird: "f32[s0, 8][8, 1]cpu" = torch.ops.aten.relu.default(relu)\n'
             '    return (weird,)\n')
    records = [
        "V1205 12:00:00.000000 1 torch/x.py:1] {not json\n",
        _record({"artifact": {"name": "inductor_post_grad_graph", "encoding": "string"}}, graph),
        _record({"artifact": {"name": "inductor_provenance_tracking_node_mappings", "encoding": "json"}}, "[oops"),
        _record({"artifact": {"name": "inductor_provenance_tracking_node_mappings", "encoding": "json"}},
                json.dumps({"cppCodeToPost": {"cpp_fused_relu_0:1": ["relu", "weird"]}})),
    ]
    log = read_torch_trace(_write(tmp_path / "t.log", records))
    (g,) = log.graphs
    assert g.nodes["relu"].shape == (4, 8) and g.nodes["weird"].shape is None  # symbolic: unknown, not a guess
    assert g.kernels["cpp_fused_relu_0:1"].nodes == ("relu", "weird")
    assert g.outputs == ("weird",)
    assert any("not JSON" in n for n in log.notes)


def test_split_args_keeps_nested_lists_and_strings_whole() -> None:
    assert split_args("a, [1, 2], b") == ["a", "[1, 2]", "b"]
    assert split_args("x, 'a,b', (1, (2, 3))") == ["x", "'a,b'", "(1, (2, 3))"]
    assert split_args("") == []


COMPILE = Path(__file__).parents[1] / "fixtures" / "compile"


def test_graph_break_records_and_backward_compile_metrics() -> None:
    log = read_torch_trace(COMPILE / "graph_break.torch_trace.log.gz")
    (brk,) = log.graph_breaks
    assert brk.compile_id == "0/0"
    assert brk.frame is not None and (brk.frame.path, brk.frame.line) == ("compiled_model.py", 30)
    assert brk.reason.startswith("Encountered graph break") and "Tensor.item()" in brk.reason
    assert "User code traceback" not in brk.reason
    assert [(f.path, f.line, f.func) for f in brk.stack if f.path == "compiled_model.py"][-1] == \
        ("compiled_model.py", 30, "forward")
    # each graph's backward compiled at the first backward(): its own record, with the compile id of the forward
    assert sorted(b.compile_id for b in log.backward_metrics) == ["0/0", "1/0"]
    for b in log.backward_metrics:
        assert b.entire_frame_compile_time_s is None and b.duration_s and b.duration_s > 0
        assert b.inductor_compile_time_s and b.inductor_compile_time_s <= b.duration_s
    assert [m.co_name for m in log.metrics] == ["forward", "torch_dynamo_resume_in_forward_at_30"]
    assert all(m.recompile_limit == 8 and m.duration_s for m in log.metrics)  # torch's default, from dynamo_config


def test_the_recompile_limit_and_cudagraph_skips_come_from_the_compile_metrics() -> None:
    log = read_torch_trace(COMPILE / "recompile.torch_trace.log.gz")
    assert [(m.compile_id, m.recompile_limit) for m in log.metrics] == \
        [("0/0", 8), ("0/1", 8), ("0/2", 8), ("1/0", 2), ("1/1", 2), ("1/2", 2)]  # frame 1 ran under patch(limit=2)
    assert log.cudagraph_skips == [] and not log.metrics[0].cudagraph_skip_reason
    skip = read_torch_trace(COMPILE / "cudagraph_skip.torch_trace.log.gz")
    assert skip.cudagraph_skips == ["skipping cudagraphs due to cpp-wrapper does not support graph partition yet"]
    assert skip.metrics[0].cudagraph_skip_reason == skip.cudagraph_skips[0]


def test_a_cached_graph_logged_as_a_top_level_record_is_read_once(tmp_path: Path) -> None:
    graph = ('def forward(self, arg0_1: "f32[4, 8][8, 1]cpu"):\n'
             '    relu: "f32[4, 8][8, 1]cpu" = torch.ops.aten.relu.default(arg0_1);  arg0_1 = None\n'
             '    return (relu,)\n')
    records = [_record({"inductor_post_grad_graph": {}}, graph),
               _record({"artifact": {"name": "inductor_post_grad_graph", "encoding": "string"}}, graph),
               _record({"artifact": {"name": "inductor_provenance_tracking_node_mappings", "encoding": "json"}},
                       json.dumps({"cppCodeToPost": {"cpp_fused_relu_0:1": ["relu"]}}))]
    log = read_torch_trace(_write(tmp_path / "t.log", records))
    (g,) = log.graphs
    assert g.kernels["cpp_fused_relu_0:1"].nodes == ("relu",)
