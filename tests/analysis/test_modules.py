"""Module paths on op rows and the inclusive module tree (modules.csv, `opscope report --tree`): from
profile's dispatch pass (exact qualified names, backward ops under their forward op's module) and from
traces recorded with_modules."""

from __future__ import annotations

import io
import math
import statistics

import pytest
from rich.console import Console

from conftest import GPT2, TRACES, run_cli, write_model
from opscope.analysis.modules import COLUMNS, OUTSIDE, common_module, finding_modules, module_table
from opscope.analysis.trace_file import analyze_trace_file
from opscope.capture.torch_profiler import profile_target
from opscope.render.console import ops_table
from opscope.render.report_data import tree_lines
from opscope.run.model import Run
from opscope.run.read import read_run
from opscope.table import to_frame
from opscope.target.specs import ProfileOptions

FAST = dict(warmup=1, peak_bw=20.0, peak_flops=["100"], threads=1)

NESTED = """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.ln_1 = nn.LayerNorm(16)
            self.ln_2 = nn.LayerNorm(16)

        def forward(self, x):
            return self.ln_2(self.ln_1(x) + self.fc(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(3)])
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            x = x * 2  # the model's own op
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    def get_model():
        return Net()

    def get_inputs():
        return [torch.randn(8, 16)]
"""


def assert_tree_adds_up(run: Run) -> None:
    """modules.csv: the depth-0 rows (the model, the ops outside it) add up to the run's op time; every
    module's inclusive time is its own ops' time plus its children's (no op counted twice); the self
    times add up to the op time; FLOPs too."""
    m = run.to_pandas("modules").set_index("module")
    total = float(run.to_pandas()["time_us_total"].sum())
    assert m.loc[m["depth"] == 0, "time_us_total"].sum() == pytest.approx(total, rel=1e-9)
    assert m["self_time_us"].sum() == pytest.approx(total, rel=1e-9)
    for name, row in m.iterrows():
        if name == OUTSIDE:
            continue
        kids = [k for k in m.index if k not in ("", OUTSIDE) and (k.rsplit(".", 1)[0] if "." in k else "") == name
                and k != name]
        assert row["time_us_total"] == pytest.approx(row["self_time_us"] + m.loc[kids, "time_us_total"].sum(),
                                                     rel=1e-9, abs=1e-6), name
        assert row["depth"] == (0 if name == "" else name.count(".") + 1)
    flops = (run.to_pandas()["flops_per_call"] * run.to_pandas()["calls"]).sum()
    assert m.loc[m["depth"] == 0, "flops_total"].sum() == pytest.approx(flops, rel=1e-9)
    assert (m["time_share"] - m["time_us_total"] / total).abs().max() < 1e-12


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("gpt2")
    path = write_model(folder, GPT2, "gpt2.py")
    run, _ = profile_target(ProfileOptions(target=path, out=folder / "run", mode="train", steps=2, **FAST))
    return run


@pytest.mark.slow
def test_gpt2_train_rows_carry_module_paths(gpt2_run):
    ops = gpt2_run.to_pandas()
    named = set(ops["module"])
    for name in ("transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj", "lm_head", "transformer.wte"):
        assert name in named, name
    assert set(ops.loc[ops["module"] == "lm_head", "module_class"]) == {"Linear"}
    # The LM head's three matmuls (forward, grad input, grad weight) are three rows of module lm_head,
    # each called once per step: backward ops carry their forward op's module.
    head = ops[(ops["op"] == "aten::mm") & (ops["module"] == "lm_head")]
    assert len(head) == 3 and len(set(head["input_dims"])) == 3
    assert list(head["calls"]) == [2, 2, 2]
    # The blocks' Conv1D matmuls share one library line; the module tells them apart.
    c_attn = ops[(ops["op"] == "aten::addmm") & ops["module"].str.endswith("attn.c_attn")]
    assert sorted(c_attn["module"]) == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]
    assert c_attn["source_location"].nunique() == 1
    # Backward work sits in the forward modules; only opscope's harness (loss, optimizer) is outside.
    outside = ops[ops["module_class"] == ""]
    assert outside["time_us_total"].sum() < 0.2 * ops["time_us_total"].sum()
    bwd = ops[ops["op"] == "aten::native_layer_norm_backward"]
    assert len(bwd) and all(m.endswith(("ln_1", "ln_2", "ln_f")) for m in bwd["module"])


@pytest.mark.slow
def test_gpt2_modules_csv_adds_up_without_double_counting(gpt2_run):
    run = read_run(gpt2_run.path)
    assert run.modules is not None
    assert list(run.to_pandas("modules").columns) == ["module", "module_class", "depth", "time_us_total", "time_share",
                                         "self_time_us", "flops_total", "bytes_total", "bound", "findings"]
    assert_tree_adds_up(run)
    m = run.to_pandas("modules").set_index("module")
    assert m.loc["", "module_class"] == "GPT2LMHeadModel"
    assert m.loc["transformer.h", "module_class"] == "ModuleList"  # a container: named from the model
    assert m.loc["transformer.h.0.mlp", "module_class"] == "GPT2MLP" and m.loc["transformer.h.0.mlp",
                                                                               "self_time_us"] == 0
    assert m.loc["", "findings"] == sum(1 for f in run.findings if isinstance(f["module"], str))
    # tree order: each module right after its parent (depth-first)
    names = list(run.to_pandas("modules")["module"])
    for k, name in enumerate(names[1:], 1):
        if name != OUTSIDE:
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            assert names.index(parent) < k


@pytest.mark.slow
def test_report_tree_folds_repeated_blocks(gpt2_run, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    proc = run_cli("report", str(gpt2_run.path), "--tree")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "[0-1] ×2" in out and "GPT2Block" in out and "c_attn ×2" in out and "lm_head" in out
    assert "ln_1 ×2" in out and "ln_[" not in out  # numbered distinct layers are not folded together
    proc = run_cli("report", str(gpt2_run.path), "--tree", "--no-fold")
    assert proc.returncode == 0, proc.stderr
    assert "[0-1]" not in proc.stdout and "c_attn" in proc.stdout and "ModuleList" in proc.stdout


def test_nested_model_module_paths(tmp_path):
    path = write_model(tmp_path, NESTED)
    run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", mode="train", steps=1, **FAST))
    ops = run.to_pandas()
    addmm = ops[ops["op"] == "aten::addmm"]
    assert sorted(addmm["module"]) == ["blocks.0.fc", "blocks.1.fc", "blocks.2.fc", "head"]
    assert set(addmm["module_class"]) == {"Linear"}
    own = ops[(ops["op"] == "aten::mul") & (ops["module"] == "")]
    assert len(own) == 1 and own["module_class"].iloc[0] == "Net"  # the model's own forward
    norms = ops[ops["op"] == "aten::native_layer_norm"]
    assert sorted(norms["module"]) == [f"blocks.{b}.ln_{k}" for b in range(3) for k in (1, 2)]
    harness = ops[ops["source_location"] == "opscope:harness"]
    assert len(harness) and set(harness["module"]) == {""} and set(harness["module_class"]) == {""}
    assert_tree_adds_up(run)
    lines = {line.path: line for line in tree_lines(run)}
    block = lines["blocks.[0-2]"]
    assert len(block.instances) == 3 and block.module_class == "Block"
    assert lines["blocks.[0-2].ln_1"].instances and "blocks.[0-2].ln_[1-2]" not in lines
    expected = run.to_pandas("modules").set_index("module").loc[[f"blocks.{b}" for b in range(3)], "time_us_total"]
    assert sorted(block.instances) == sorted(expected)
    assert block.time_us == pytest.approx(expected.sum())
    assert statistics.median(block.instances) == pytest.approx(statistics.median(expected))
    unfolded = [line.path for line in tree_lines(run, fold=False)]
    assert "blocks.1.fc" in unfolded and not any("[" in p for p in unfolded)


@pytest.fixture(scope="module")
def bert_trace_run(tmp_path_factory):
    return analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=tmp_path_factory.mktemp("bert") / "run")


def test_trace_module_paths_from_with_modules_events(bert_trace_run):
    run = bert_trace_run
    ops = run.to_pandas()
    head = ops[ops["input_dims"].str.startswith("[[30522]")]
    assert list(head["module"]) == ["BertOnlyMLMHead.BertLMPredictionHead.Linear"]
    # q, k and v are the self-attention's Linear_0..2 in every layer; the layers are BertLayer_0..3
    qkv = ops[(ops["op"] == "aten::addmm") & ops["module"].str.contains("BertSdpaSelfAttention")]
    assert sorted(set(qkv["module"])) == sorted(
        f"BertModel.BertEncoder.BertLayer_{layer}.BertAttention.BertSdpaSelfAttention.Linear_{k}"
        for layer in range(4) for k in range(3))
    assert set(qkv["module_class"]) == {"Linear"}
    assert_tree_adds_up(run)
    m = run.to_pandas("modules").set_index("module")
    assert m.loc["", "module_class"] == "BertLMHeadModel"  # the root, from its nn.Module event
    assert m.loc["BertModel.BertEncoder", "module_class"] == "BertEncoder"
    lines = {line.path: line for line in tree_lines(run)}
    assert len(lines["BertModel.BertEncoder.BertLayer_[0-3]"].instances) == 4
    assert "BertModel.BertEncoder.BertLayer_[0-3].BertAttention.BertSdpaSelfAttention.Linear_0" in lines


def test_trace_without_module_events_has_no_module_tree(tmp_path):
    run = analyze_trace_file(TRACES / "mi300x_torch-compile_triton.json.gz", out=tmp_path / "run")
    assert run.modules is None and not (tmp_path / "run" / "modules.csv").exists()
    assert set(run.to_pandas()["module"]) == {""} and set(run.to_pandas()["module_class"]) == {""}


def test_findings_count_in_the_innermost_module_around_their_ops():
    ops = {  # an ops Table (opscope.table)
        "op": ["aten::add", "aten::add", "aten::mm", "aten::mul"],
        "source_location": ["m.py:3", "m.py:3", "m.py:9", "opscope:harness"],
        "module": ["enc.h.0.mlp", "enc.h.1.mlp", "head", ""],
        "module_class": ["MLP", "MLP", "Linear", ""],
        "time_us_total": [10.0, 20.0, 35.0, 5.0], "calls": [1, 1, 1, 1],
        "flops_per_call": [1.0, 1.0, math.nan, 2.0], "bytes_per_call": [4.0, 4.0, 8.0, 8.0],
        "bound": ["memory", "memory", "compute", "overhead"],
    }
    findings = [{"op": "aten::add", "source_location": "m.py:3"}, {"op": "aten::mm", "source_location": "m.py:9"},
                {"op": "aten::mul", "source_location": "opscope:harness"}, {"op": "x", "source_location": "m.py:9"}]
    finding_modules(findings, ops)
    assert [f["module"] for f in findings] == ["enc.h", "head", None, "head"]
    modules = module_table(ops, findings)
    # tree order: children by inclusive time, largest first (head 35 µs before enc 30 µs), OUTSIDE last
    assert list(modules) == COLUMNS and modules["module"] == ["", "head", "enc", "enc.h", "enc.h.1", "enc.h.1.mlp",
                                                              "enc.h.0", "enc.h.0.mlp", OUTSIDE]
    assert modules["depth"] == [0, 1, 1, 2, 3, 4, 3, 4, 0]
    assert modules["time_share"][0] == 65.0 / 70.0 and modules["self_time_us"][:3] == [0.0, 35.0, 0.0]
    table = to_frame(modules).set_index("module")
    assert table.loc["enc.h", "findings"] == 1 and table.loc["", "findings"] == 3
    assert table.loc[OUTSIDE, "findings"] == 1 and table.loc[OUTSIDE, "time_us_total"] == 5.0
    assert table.loc["enc", "time_us_total"] == 30.0 and table.loc["", "time_us_total"] == 65.0
    assert table.loc["enc.h.0.mlp", "bound"] == "memory" and table.loc["", "bound"] == "compute"
    assert table.loc["", "flops_total"] == 2.0  # unknown FLOPs (NaN) are left out, not counted as 0
    assert math.isnan(table.loc["head", "flops_total"])
    assert common_module(["a.b.c", "a.b.d", "a.b"]) == "a.b" and common_module(["x", "y"]) == ""


def render_table(run: Run, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(ops_table(run, 8, width))
    return out.getvalue()


def test_console_shows_module_and_source_or_whichever_fits(tmp_path):
    path = write_model(tmp_path, NESTED)
    run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", steps=1, **FAST))
    wide = render_table(run, 200)
    header = next(line for line in wide.splitlines() if line.lstrip().startswith("#"))
    assert " module " in header and " source " in header and " per call " in header
    assert "blocks.0.fc" in wide or "head" in wide
    narrow = render_table(run, 80)
    header = next(line for line in narrow.splitlines() if line.lstrip().startswith("#"))
    assert " where " in header and " module " not in header and " per call " not in header
    assert max(len(line) for line in narrow.splitlines()) <= 80
    top = run.to_pandas().iloc[0]
    shown = "(model)" if top["module"] == "" and top["module_class"] else top["module"]
    row_line = next(line for line in narrow.splitlines() if line.lstrip().startswith("1 "))
    assert row_line.rstrip().endswith(shown[-10:]), (row_line, shown)
