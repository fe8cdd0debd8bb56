"""Work split between an op and its child ops, from runs profiled through `opscope profile`: each op
subtree must add up to the hand count, every part counted once.

- Losses that write an unreduced tensor and reduce it in a child op (mse_loss -> mean -> sum + div_,
  binary_cross_entropy -> mul_ (weight) + sum + copy_): the reduction counted once, the unreduced write
  counted.
- CPU addmm / baddbmm, whose child copy_ writes the bias into the output: bias + A + B + output, the
  same as a GPU addmm without that child (recorded H100 trace)."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from conftest import line_of, write_model
from opscope.capture.torch_profiler import profile_target
from opscope.target.specs import ProfileOptions

N = 16 * 32  # loss elements
F32 = 4

MODEL = """
    import torch
    import torch.nn.functional as F

    TARGET = torch.rand(16, 32)
    WEIGHT = torch.rand(32)

    def get_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Sigmoid())

    def get_inputs():
        return [torch.randn(16, 32)]

    def loss_fn(out):
        return {loss}
"""


def loss_subtree(tmp_path, loss: str, root: str) -> pd.DataFrame:
    return subtree(profiled_events(tmp_path, MODEL.replace("{loss}", loss), mode="train"), root)


def profiled_events(tmp_path, source: str, mode: str = "inference") -> pd.DataFrame:
    """The event table of a one-step profile of `source`, costs included."""
    path = write_model(tmp_path, source)
    run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", mode=mode, steps=1, warmup=1,
                                           peak_bw=20.0, peak_flops=["100"], threads=1))
    return run.to_pandas("events")


def subtree(ev: pd.DataFrame, root: str) -> pd.DataFrame:
    """The one `root` op's event and its descendants'."""
    roots = ev.index[ev["name"] == root].tolist()
    assert len(roots) == 1, roots
    parent = ev["parent"].to_dict()
    keep = set(roots)
    for i in sorted(parent, key=lambda i: ev.at[i, "depth"]):
        if parent[i] in keep:
            keep.add(i)
    return ev.loc[sorted(keep)]


@pytest.mark.slow
def test_mse_loss_mean_counts_the_reduction_once(tmp_path):
    sub = loss_subtree(tmp_path, "F.mse_loss(out, TARGET)", "aten::mse_loss")
    costs = {name: (float(g["flops"].sum()), float(g["bytes"].sum())) for name, g in sub.groupby("name")}
    # mse_loss: x - y, square (2 per element); x and y read, the unreduced loss written
    assert costs["aten::mse_loss"] == (2 * N, 3 * N * F32)
    # its child mean = sum (1 per element; reads the unreduced loss, writes 1) + div_ by N, on CPU
    assert costs["aten::mean"] == (0, 0)
    assert costs["aten::sum"] == (N, N * F32 + F32)
    assert costs["aten::fill_"] == (0, F32)  # sum zero-fills its one-element output
    # div_(loss, 512): 1 FLOP; reads the loss and the wrapped long 512, writes the loss; the long -> float
    # conversion of 512 is a child copy_ (8 read, 4 written)
    assert costs["aten::div_"] == (1, F32 + 8 + F32)
    assert costs["aten::copy_"] == (0, 8 + F32)
    assert float(sub["flops"].sum()) == 3 * N + 1  # the reduction once: was 4N + 1
    assert float(sub["bytes"].sum()) == 3 * N * F32 + (N * F32 + F32) + F32 + 16 + 12 == 8228


@pytest.mark.slow
def test_weighted_bce_sum_counts_the_reduction_once(tmp_path):
    sub = loss_subtree(tmp_path, 'F.binary_cross_entropy(out, TARGET, weight=WEIGHT, reduction="sum")',
                       "aten::binary_cross_entropy")
    costs = {name: (float(g["flops"].sum()), float(g["bytes"].sum())) for name, g in sub.groupby("name")}
    # the kernel's 9 per element; x and y read, the unreduced loss written (the weight: child mul_)
    assert costs["aten::binary_cross_entropy"] == (9 * N, 3 * N * F32)
    # loss.mul_(weight.expand(16, 32)): the loss read and written, the 32 weights read once
    assert costs["aten::mul_"] == (N, 2 * N * F32 + 32 * F32)
    # sum(loss) (an outer sum over the inner one), its one-element fill, the copy_ of the scalar result
    assert costs["aten::sum"] == (N, N * F32 + F32)
    assert costs["aten::fill_"] == (0, F32)
    assert costs["aten::copy_"] == (0, 2 * F32)
    assert float(sub["flops"].sum()) == 11 * N
    assert float(sub["bytes"].sum()) == 3 * N * F32 + (2 * N * F32 + 128) + (N * F32 + F32) + F32 + 8 == 12432


LINEAR = """
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 32)
            self.bias = torch.nn.Parameter(torch.randn(32))

        def forward(self, x, a, b):
            return self.linear(x), torch.baddbmm(self.bias, a, b)

    def get_inputs():
        return [torch.randn(8, 16), torch.randn(3, 8, 16), torch.randn(3, 16, 32)]
"""


@pytest.mark.slow
def test_cpu_addmm_and_bias_copy_count_one_output_write(tmp_path):
    ev = profiled_events(tmp_path, LINEAR)
    for root, batch in (("aten::addmm", 1), ("aten::baddbmm", 3)):
        sub = subtree(ev, root)
        costs = {name: (float(g["flops"].sum()), float(g["bytes"].sum())) for name, g in sub.groupby("name")}
        a, b, bias, out = batch * 8 * 16 * F32, batch * 16 * 32 * F32, 32 * F32, batch * 8 * 32 * F32
        # the child copy_(out, bias.expand(...)): the 32 bias values read, the output written
        assert costs["aten::copy_"] == (0, bias + out)
        # the op: 2*M*N*K, A and B read (the weight's transpose is a view: its storage once)
        assert costs[root] == (2 * batch * 8 * 32 * 16, a + b)
        assert float(sub["bytes"].sum()) == bias + a + b + out  # one addmm's minimum traffic
        assert "child copy_" in sub.loc[sub["name"] == root, "note"].iloc[0]


def test_gpu_addmm_without_a_bias_copy_counts_everything():
    from conftest import TRACES
    from opscope.analysis.events import build_events
    from opscope.analysis.ops_table import event_costs
    from opscope.table import to_frame
    from opscope.trace.reader import load_trace

    table = build_events(load_trace(TRACES / "h100_bert-small_bf16.json.gz"))
    table.update(event_costs(table))
    ev = to_frame(table)
    addmm = ev[(ev["name"] == "aten::addmm") & (ev["input_dims"] == "[[512], [141, 512], [512, 512], [], []]")]
    assert len(addmm) and not (ev["name"].eq("aten::copy_") & ev["row_parent"].isin(addmm.index)).any()
    bf16 = 2  # bias + A + B + output, all counted at the op
    assert set(addmm["bytes"]) == {(512 + 141 * 512 + 512 * 512 + 141 * 512) * bf16}
    assert set(addmm["note"]) == {""}


CEILINGS = """
    import torch

    class Model(torch.nn.Module):
        def forward(self, a, b, x):
            return torch._int_mm(a, b), x @ x, torch.relu(x)

    def get_inputs():
        return [torch.randint(-8, 8, (64, 128), dtype=torch.int8), torch.randint(-8, 8, (128, 64), dtype=torch.int8),
                torch.randn(128, 128, dtype=torch.float64)]
"""


def test_int8_gemm_and_float64_ops_get_their_ceilings(tmp_path):
    path = write_model(tmp_path, CEILINGS)
    run, _ = profile_target(ProfileOptions(
        target=path, out=tmp_path / "run", steps=1, warmup=1, peak_bw=20.0, threads=1,
        peak_flops=["float32=100", "float64=50", "float64_vector=25", "int8=400", "float16=200"]))
    ops = run.to_pandas().set_index("op")
    # _int_mm: int8 operands -> dtype int8 -> the INT8 ceiling
    assert (ops.loc["aten::_int_mm", "dtype"], ops.loc["aten::_int_mm", "ceiling"]) == ("int8", "int8")
    assert ops.loc["aten::_int_mm", "flops_per_call"] == 2 * 64 * 64 * 128
    # float64: the GEMM against the FP64 (tensor-core) figure, the element-wise op against the vector one
    assert (ops.loc["aten::mm", "dtype"], ops.loc["aten::mm", "ceiling"]) == ("float64", "float64")
    assert (ops.loc["aten::clamp_min", "dtype"], ops.loc["aten::clamp_min", "ceiling"]) == ("float64", "float64_vector")
    row = ops.loc["aten::clamp_min"]
    assert row["pct_peak_flops"] == pytest.approx(row["achieved_gflops"] / 25 * 100)


CATS = """
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                           torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU())

        def forward(self, x, i1, i2, h1, h2):
            y = self.net(x)
            pairs = torch.cat([i1, i2]), torch.cat([h1, h2])
            stacked = torch.stack([h1, h2])  # CPU: a child cat([h1, h2]) and a view
            return y, pairs, stacked

    def get_inputs():
        return [torch.randn(32, 64), torch.randint(0, 9, (128, 16)), torch.randint(0, 9, (128, 16)),
                torch.randn(128, 64).half(), torch.randn(128, 64).half()]
"""
INT64_PAIR = "[[[128, 16], [128, 16]], []]"
FP16_PAIR = "[[[128, 64], [128, 64]], []]"


def cat_rows(ops: pd.DataFrame, path) -> pd.DataFrame:
    """aten::cat rows by (input dims, "pairs" or "stacked": the line that issued them)."""
    cats = ops[ops["op"] == "aten::cat"].copy()
    stack_line = line_of(path, "torch.stack")
    cats["line"] = ["stacked" if loc.endswith(f":{stack_line}") else "pairs" for loc in cats["source_location"]]
    assert len(cats) == 3, cats[["input_dims", "source_location"]]
    return cats.set_index(["input_dims", "line"])


def test_tensorlist_dtypes_from_the_dispatch_pass(tmp_path):
    from conftest import PEAKS, run_cli

    path = write_model(tmp_path, CATS)
    profiled = run_cli("profile", str(path), "--out", str(tmp_path / "run"), "--steps", "1", *PEAKS)
    assert profiled.returncode == 0, profiled.stderr
    ops = pd.read_csv(tmp_path / "run" / "ops.csv", keep_default_na=False)
    cats = cat_rows(ops, path)
    # every pair: both tensors read once in their own dtype, the concatenation written
    int64_bytes = 2 * (128 * 16 * 8)
    fp16_bytes = 2 * (128 * 64 * 2)
    assert cats.loc[(INT64_PAIR, "pairs"), "bytes_per_call"] == 2 * int64_bytes  # not half, as float32
    assert cats.loc[(FP16_PAIR, "pairs"), "bytes_per_call"] == 2 * fp16_bytes  # not twice, as float32
    assert cats.loc[(FP16_PAIR, "stacked"), "bytes_per_call"] == 2 * fp16_bytes  # inside stack: its lists
    assert set(cats["note"]) == {""}
    assert cats.loc[(FP16_PAIR, "pairs"), "dtype"] == "float16"
    assert cats.loc[(INT64_PAIR, "pairs"), "dtype"] == ""  # no floating-point input

    # analyze of the trace profile saved reads the dtypes profile embedded in it: the same bytes
    again = run_cli("analyze", str(tmp_path / "run" / "trace.json.gz"), "--out", str(tmp_path / "again"), *PEAKS)
    assert again.returncode == 0, again.stderr
    assert cat_rows(pd.read_csv(tmp_path / "again" / "ops.csv", keep_default_na=False), path).equals(cats)

    # a trace without them has only "TensorList" as the type: the run's most common dtype (float32) is
    # assumed, and every such row says so
    doc = json.loads(gzip.decompress((tmp_path / "run" / "trace.json.gz").read_bytes()))
    del doc["opscope"]
    (tmp_path / "bare.json").write_text(json.dumps(doc))
    analyzed = run_cli("analyze", str(tmp_path / "bare.json"), "--out", str(tmp_path / "analyzed"), *PEAKS)
    assert analyzed.returncode == 0, analyzed.stderr
    ops = pd.read_csv(tmp_path / "analyzed" / "ops.csv", keep_default_na=False)
    cats = ops[ops["op"] == "aten::cat"].set_index("input_dims")  # (no source lines in this trace)
    assert cats.loc[INT64_PAIR, "bytes_per_call"] == 2 * int64_bytes / 2
    assert cats.loc[FP16_PAIR, "bytes_per_call"] == 2 * fp16_bytes * 2
    assert cats.loc[FP16_PAIR, "calls"] == 2  # the explicit cat and stack's
    assert set(cats["note"]) == {"TensorList dtype not recorded: assumed float32 (the run's most common dtype)"}


def test_profiler_dtype_names(tmp_path):
    """The dispatch pass names element dtypes as torch.profiler's "Input type" does."""
    import json
    import warnings

    import torch

    from opscope.capture.lines import PROFILER_DTYPES

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is experimental
        tensors = [torch.zeros(2, dtype=getattr(torch, name)) for name in PROFILER_DTYPES]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for t in tensors:
            t.clone()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    recorded = [e["args"]["Input type"][0] for e in events if e.get("name") == "aten::clone"]
    assert recorded == list(PROFILER_DTYPES.values())
